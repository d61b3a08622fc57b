// How many OpenMP threads each rank computes with (train.threads), and the warning when a job
// asks for more threads than its host has cores.
//
// Ranks on one host share its cores. train.threads = 0 (automatic) gives each rank
// max(1, min(cores_of_rank, cores_on_host / ranks_on_host)) threads, so that a job never starts
// more threads than it has cores unless it has more ranks than cores; when the environment
// sets OMP_NUM_THREADS, that count is used instead (the user chose it). A count that
// oversubscribes the most crowded host of the job (ranks_on_host x threads > cores_on_host,
// or more threads than the rank's own cores) is allowed, with a warning that says the numbers
// and what to do: threads that outnumber cores take turns, and a step then runs many times
// slower.
//
// The thread count changes speed only: every kernel's result is bitwise the same at any count
// (tests/train/thread_count_test.cc).
#pragma once

#include "comm/mpi_runtime.h"

#include <cstdint>
#include <optional>
#include <string>

namespace oases::train {

struct ThreadChoice {
  int threads = 1;      // OpenMP threads of each rank
  std::string reason;   // how the count was chosen, for the start-up log
  std::string warning;  // empty unless the host is oversubscribed
};

// The most threads per core of the host an explicit count may ask for.
inline constexpr std::int64_t kMostThreadsPerCore = 8;

// `requested`: train.threads (0: automatic); `omp_num_threads`: the OMP_NUM_THREADS of the
// environment when set to a positive count; `mine`: this rank's placement; `most_crowded`:
// the job's most crowded host (the same on every rank). UserError when the explicit count
// (train.threads, else OMP_NUM_THREADS) exceeds kMostThreadsPerCore x the host's cores.
ThreadChoice choose_threads(std::int64_t requested, std::optional<int> omp_num_threads,
                            const comm::HostPlacement& mine,
                            const comm::HostPlacement& most_crowded);

// OMP_NUM_THREADS when it holds a positive integer (the first entry of a nested list).
std::optional<int> omp_num_threads_from_environment();

// choose_threads for this process from the environment, applied with omp_set_num_threads.
ThreadChoice use_threads(std::int64_t requested, const comm::HostPlacement& mine,
                         const comm::HostPlacement& most_crowded);

}  // namespace oases::train
