// Who runs a CPU kernel's loop. By default the OpenMP team shares it (when the work is large
// enough to pay for waking the threads); a caller that already shares its own work among the
// threads in pieces (the 16-bit kernels of kernels/half_kernels.cc, which convert piece by
// piece in the cache) runs the kernel on each piece with Threads::calling_thread instead: a
// parallel region opened inside another one costs microseconds even though it runs on one
// thread, which at a piece of tens of kilobytes is as much as the piece's work.
//
// Either way every iteration does the same arithmetic, so results do not depend on it.
#pragma once

#include <cstdint>

namespace oases::kernels::cpu {

enum class Threads : std::uint8_t { team, calling_thread };

// body(i) for i in [0, n): across the OpenMP team (static schedule) when `threads` is team and
// `worth_a_team`, else in order on the calling thread.
template <class Body>
void for_each_index(std::int64_t n, Threads threads, bool worth_a_team, const Body& body) {
  if (threads == Threads::calling_thread || !worth_a_team) {
    for (std::int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace oases::kernels::cpu
