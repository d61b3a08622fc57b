// MPI start-up and shut-down, and the settings shared by every MPI communicator.
//
// A process that runs under a launcher (mpirun, srun) creates exactly one MpiRuntime before
// any MPI communicator and destroys it after the last one (in practice: declare it first in
// main, and the Mesh after it). A process started on its own need not touch MPI at all:
// launched_by_mpi() tells the two cases apart, and Mesh::single_process() serves the second.
//
// This header does not include <mpi.h>, so code that only passes the runtime along (the CLI,
// the Mesh factory) stays free of MPI types.
#pragma once

#include "comm/flight_recorder.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace oases::comm {

// True when the environment shows that an MPI launcher started this process: OpenMPI's
// mpirun (OMPI_COMM_WORLD_SIZE), MPICH/Hydra and srun's PMI-1/PMI-2 plugins (PMI_SIZE,
// PMI_RANK), PMIx launchers including srun --mpi=pmix (PMIX_RANK), MVAPICH
// (MV2_COMM_WORLD_SIZE). SLURM_* variables alone do not count: they are also set in a batch
// script that runs the binary without a launcher.
bool launched_by_mpi();

// The rank the launcher gave this process (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK,
// MV2_COMM_WORLD_RANK), read from the environment without initialising MPI; nullopt when no
// launcher started it.
std::optional<int> launcher_rank();

// Where a process runs, for choosing how many threads it computes with: how many ranks of the
// job share its host, and how many cores they and it may use (sched_getaffinity, so that
// taskset, cgroups' cpusets and a launcher's binding all count).
struct HostPlacement {
  std::string host;        // host name
  int ranks_on_host = 1;   // processes of the job on this host, this one included
  int cores_on_host = 1;   // cores in the union of the affinity masks of those processes
  int cores_of_rank = 1;   // cores in this process's own affinity mask
};

// The placement of a process started without a launcher: one rank on its host.
HostPlacement this_process_placement();

// How the ranks of a job sit on hosts, for the start-up line: "4 ranks on 2 hosts: a (ranks
// 0, 1), b (ranks 2, 3)". `rank_hosts` holds each world rank's host name (MpiRuntime::
// rank_hosts()); hosts are listed in the order of their lowest rank, a host's ranks compactly
// ("0-3" for a run of three or more).
std::string describe_rank_hosts(const std::vector<std::string>& rank_hosts);

// Where ranks of this job leave their start-up markers: <temp dir>/oases-startup-<job id>,
// with the job id from the launcher (PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid, or SLURM's job
// and step ids). Empty when the launcher gives no job id (then no markers are written).
std::string startup_marker_directory();

// Initialises MPI for this process with MPI_THREAD_MULTIPLE (every communicator has its own
// progress thread calling MPI) and finalises it on destruction.
//
// Before initialising it sets OpenMPI's mpi_yield_when_idle (OMPI_MCA_mpi_yield_when_idle=1)
// unless the environment already sets it: OpenMPI's blocking calls otherwise busy-poll and
// take the core the compute thread needs (docs/architecture.md, "Communication").
//
// Start-up timeout: every rank must finish MPI_Init and check in with rank 0 within
// `startup_timeout_seconds` (0: wait forever). A rank stopped or lost before then would
// otherwise hang its peers inside MPI_Init, where no communicator timeout can reach them.
//   - While MPI_Init runs, a watchdog thread waits for the deadline. Each rank leaves a marker
//     file (startup_marker_directory()) before MPI_Init, so on expiry the watchdog can name
//     the ranks that never started (a marker is seen on its own host, or wherever that folder
//     is shared); where the launcher runs a PMIx server (Open MPI's mpirun, srun --mpi=pmix),
//     the host it placed each of them on is named too. It prints them and ends the process
//     with exit code 3, which makes the launcher end the job.
//   - After MPI_Init, every rank sends rank 0 a message and waits for its reply; rank 0 names
//     the ranks whose message did not arrive before the deadline and aborts the job.
//   - With a `flight_directory`, a rank that reports a start-up timeout also leaves its flight
//     record there (comm/flight_recorder.h: no operations, the message as its reason), so that
//     `oases flight` reads a job that never started like one that hung later.
//
// Throws UserError if the MPI library cannot provide MPI_THREAD_MULTIPLE (naming the level it
// provided) and InternalError if MPI was already initialised or finalised in this process
// (MPI allows one initialisation per process).
class MpiRuntime {
 public:
  explicit MpiRuntime(double startup_timeout_seconds = 0, std::string flight_directory = "");
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

  // This rank's placement: its host's ranks are found with MPI_Comm_split_type (shared
  // memory) at start-up, and their affinity masks combined.
  const HostPlacement& placement() const { return placement_; }
  // The placement of a rank on the most crowded host of the job (the highest ranks_on_host /
  // cores_on_host; the lowest rank among ties), the same on every rank, so that rank 0 can
  // speak for every host.
  const HostPlacement& most_crowded_placement() const { return most_crowded_; }
  // Every world rank's host name (as each rank's gethostname() gives it), indexed by rank.
  const std::vector<std::string>& rank_hosts() const { return rank_hosts_; }

 private:
  int world_rank_ = 0;
  int world_size_ = 1;
  HostPlacement placement_;
  HostPlacement most_crowded_;
  std::vector<std::string> rank_hosts_;
};

// Settings of an MPI communicator (kept here, free of MPI types, so that Mesh can take them).
struct MpiCommunicatorOptions {
  // An operation that has not completed this many seconds after it started (reached the head
  // of its communicator's queue) is reported to on_timeout. 0 waits forever.
  double timeout_seconds = 300;

  // Called once per late operation, on the communicator's progress thread, with a message
  // naming the operation, element count, dtype, group, rank and world rank. Empty (the
  // default): print the message to stderr and MPI_Abort the whole job. A handler that returns
  // lets the operation keep waiting; it must be thread-safe and must not throw (tests use one
  // to observe timeouts without killing the process).
  std::function<void(const std::string& message)> on_timeout;

  // Largest element count handed to one MPI call; larger operations are split into chunks of
  // at most this many elements (per rank block for all_gather, reduce_scatter and
  // all_to_all). MPI-3 counts are int, so the default is the int limit; tests lower it to
  // exercise the chunked paths on small buffers. Must be >= 1.
  std::int64_t max_elements_per_call = std::numeric_limits<int>::max();
  // Largest number of bytes one MPI call of a collective or message moves (all ranks' blocks
  // of an all_gather, reduce_scatter or all_to_all together; all_to_allv excepted); 0: no
  // bound beyond max_elements_per_call. Bounds the transport's own buffers whatever the size
  // of the operation (parallel.bucket_bytes; ZeRO-R's constant buffer sizing). A chunk holds
  // at least one element per block.
  std::int64_t max_bytes_per_call = 0;

  // Where each communicator keeps its last operations (comm/flight_recorder.h); null: nowhere.
  // A collective timeout or an MPI error writes the record before the job is ended.
  std::shared_ptr<FlightRecorder> flight;

  // A test seam: this rank misbehaves once in one collective (comm_fault_from_environment).
  std::optional<CommFault> fault;
};

}  // namespace oases::comm
