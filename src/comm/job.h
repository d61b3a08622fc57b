// Ending a multi-process job from one rank. When a rank fails, the others would wait forever
// in their next collective with it; the failing rank reports its error (with its rank) and
// then stops the whole job.
#pragma once

namespace oases::comm {

// MPI_Abort on the world communicator: every process of the job exits with `code`.
[[noreturn]] void abort_job(int code);

}  // namespace oases::comm
