#include "train/threads.h"

#include "core/error.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace oases::train {

ThreadChoice choose_threads(std::int64_t requested, std::optional<int> omp_num_threads,
                            const comm::HostPlacement& mine,
                            const comm::HostPlacement& most_crowded) {
  ThreadChoice choice;
  const std::string ranks_here = fmt::format("{} rank{} on {}", mine.ranks_on_host,
                                             mine.ranks_on_host == 1 ? "" : "s", mine.host);
  // Past a few threads per core nothing runs faster, and OpenMP's thread creation fails or
  // crashes long before the count fits an int (libgomp segfaults at 100000 on 2 cores).
  const std::int64_t most = kMostThreadsPerCore * std::max(1, mine.cores_on_host);
  const auto check_runnable = [&](const char* setting, std::int64_t count) {
    OASES_CHECK(count <= most,
                "{} = {} is more threads than host {} can run ({} core{}); valid: 1 to {} ({} "
                "per core at most; {} or fewer avoid threads taking turns), or {}",
                setting, count, mine.host, mine.cores_on_host, mine.cores_on_host == 1 ? "" : "s",
                most, kMostThreadsPerCore, std::max(1, mine.cores_of_rank),
                requested > 0 ? "train.threads = 0 (automatic)" : "OMP_NUM_THREADS unset");
  };
  if (requested > 0) {
    check_runnable("train.threads", requested);
    choice.threads = static_cast<int>(requested);
    choice.reason = "train.threads";
  } else if (omp_num_threads) {
    check_runnable("OMP_NUM_THREADS", *omp_num_threads);
    choice.threads = *omp_num_threads;
    choice.reason = "OMP_NUM_THREADS";
  } else {
    const int share = mine.cores_on_host / mine.ranks_on_host;
    choice.threads = std::max(1, std::min(mine.cores_of_rank, share));
    choice.reason = fmt::format("automatic: {} core{} for {}", mine.cores_on_host,
                                mine.cores_on_host == 1 ? "" : "s", ranks_here);
  }

  const comm::HostPlacement& h = most_crowded;
  const bool automatic = requested == 0 && !omp_num_threads;
  if (automatic) {
    if (h.ranks_on_host > h.cores_on_host)
      choice.warning = fmt::format(
          "{} ranks run on host {}, which gives them {} core{}: each rank computes with 1 "
          "thread, and ranks take turns on the cores, so every step runs several times slower "
          "than with {} rank{} on that host. Launch at most {} rank{} per host (mpirun -np), or "
          "accept the slowdown (results are the same)",
          h.ranks_on_host, h.host, h.cores_on_host, h.cores_on_host == 1 ? "" : "s",
          h.cores_on_host, h.cores_on_host == 1 ? "" : "s", h.cores_on_host,
          h.cores_on_host == 1 ? "" : "s");
    return choice;
  }
  const long wanted = static_cast<long>(h.ranks_on_host) * choice.threads;
  if (wanted > h.cores_on_host || choice.threads > mine.cores_of_rank) {
    const int fitting =
        std::max(1, std::min(h.cores_on_host / h.ranks_on_host, mine.cores_of_rank));
    choice.warning = fmt::format(
        "{} = {} threads per rank x {} rank{} on host {} = {} threads for {} core{} (this rank "
        "may use {}): threads take turns on the cores and every step runs far slower. {} "
        "(automatic: {} here) or at most {}, or launch fewer ranks per host (results are the "
        "same at any thread count)",
        choice.reason, choice.threads, h.ranks_on_host, h.ranks_on_host == 1 ? "" : "s", h.host,
        wanted, h.cores_on_host, h.cores_on_host == 1 ? "" : "s", mine.cores_of_rank,
        requested > 0 ? "Set train.threads = 0" : "Unset OMP_NUM_THREADS", fitting, fitting);
  }
  return choice;
}

std::optional<int> omp_num_threads_from_environment() {
  const char* value = std::getenv("OMP_NUM_THREADS");
  if (value == nullptr) return std::nullopt;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  if (end == value || (*end != '\0' && *end != ',') || parsed <= 0 || parsed > 1 << 20)
    return std::nullopt;
  return static_cast<int>(parsed);
}

ThreadChoice use_threads(std::int64_t requested, const comm::HostPlacement& mine,
                         const comm::HostPlacement& most_crowded) {
  ThreadChoice choice =
      choose_threads(requested, omp_num_threads_from_environment(), mine, most_crowded);
  omp_set_num_threads(choice.threads);
  return choice;
}

}  // namespace oases::train
