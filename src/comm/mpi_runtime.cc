#include "comm/mpi_runtime.h"

#include "core/error.h"

#include <mpi.h>

#include <cstdlib>

namespace oases::comm {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

bool has_env(const char* name) { return std::getenv(name) != nullptr; }

}  // namespace

bool launched_by_mpi() {
  return has_env("OMPI_COMM_WORLD_SIZE") || has_env("PMI_SIZE") || has_env("PMI_RANK") ||
         has_env("PMIX_RANK") || has_env("MV2_COMM_WORLD_SIZE");
}

MpiRuntime::MpiRuntime() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  OASES_ASSERT(!initialized && !finalized,
               "MPI was already {} in this process; create one MpiRuntime, once",
               finalized ? "finalised" : "initialised");

  // Overwrite = 0: a user who sets the parameter (environment, or mpirun --mca, which
  // arrives through the environment) keeps the value they chose.
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);

  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    OASES_FAIL(
        "the MPI library provides {} but oases needs MPI_THREAD_MULTIPLE (each "
        "communicator has its own progress thread); use an MPI built with full thread "
        "support (OpenMPI: configure --enable-mpi-thread-multiple, the default since 3.0)",
        thread_level_name(provided));
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
}

MpiRuntime::~MpiRuntime() { MPI_Finalize(); }

}  // namespace oases::comm
