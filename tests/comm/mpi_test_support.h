// Shared by the comm *_mpitest binaries, which run under mpirun with their own main
// (mpi_test_main.cc): the process's MPI runtime and helpers to build meshes at every layout.
#pragma once

#include "comm/mpi_runtime.h"

#include <array>
#include <vector>

namespace oases::comm::mpitest {

// The process's one MpiRuntime, created on first use (main touches it before the tests run)
// and finalised when the process exits.
const MpiRuntime& runtime();

// Communicator options for tests: the default abort-on-timeout, but after 30 s rather than
// 300 s, so a test that leaves a peer waiting fails the run quickly instead of hanging ctest.
MpiCommunicatorOptions test_options();

// Every (tp, dp, pp) whose product is world_size.
std::vector<std::array<int, 3>> layouts(int world_size);

}  // namespace oases::comm::mpitest
