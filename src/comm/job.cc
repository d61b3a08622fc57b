#include "comm/job.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

namespace oases::comm {

void abort_job(int code) {
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace oases::comm
