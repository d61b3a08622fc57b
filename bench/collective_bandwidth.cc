// Bus bandwidth of the MPI backend's collectives, 1 KiB to 64 MiB, on however many ranks the
// job has (run under mpirun; bench/run_parallel_bench.sh uses 2 ranks on shared memory).
// Bus bandwidth follows the nccl-tests convention, so numbers compare across rank counts:
//   all_reduce: 2 (n - 1) / n x bytes / time;  all_gather, reduce_scatter: (n - 1) / n x bytes /
//   time
// where bytes is the size of the whole (gathered / reduced) buffer. The in-place forms are
// those sequence parallelism issues (its all-gathers and reduce-scatters work on one slot:
// this rank's block where it lies in the whole buffer).
#include "comm/mesh.h"
#include "comm/mpi_runtime.h"
#include "core/buffer.h"
#include "core/timer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace oases;

int main() {
  comm::MpiRuntime runtime;
  auto mesh = comm::Mesh::create(runtime, runtime.world_size(), 1, 1);
  comm::Communicator& group = mesh.world();
  const int n = group.size();
  const double ranks = n;
  if (group.rank() == 0)
    fmt::print(
        "{:>10} {:>14} {:>14} {:>14} {:>14} {:>14}   (bus bandwidth, GB/s, {} ranks, median "
        "of runs)\n",
        "bytes", "all_reduce", "all_gather", "reduce_scatter", "AG in place", "RS in place", n);
  for (std::int64_t bytes = 1024; bytes <= (std::int64_t{64} << 20); bytes *= 4) {
    const std::int64_t elems = bytes / 4;
    const std::int64_t shard = std::max<std::int64_t>(1, elems / n);
    Buffer a(static_cast<std::size_t>(shard * n) * 4), b(static_cast<std::size_t>(shard * n) * 4);
    const int repeats = bytes <= (1 << 20) ? 50 : 8;
    auto time_op = [&](auto&& op) {
      std::vector<double> seconds;
      op();  // warm-up
      for (int r = 0; r < repeats; ++r) {
        group.barrier();
        const Stopwatch clock;
        op();
        seconds.push_back(clock.seconds());
      }
      std::sort(seconds.begin(), seconds.end());
      return seconds[seconds.size() / 2];
    };
    const Tensor whole = Tensor::of(a.as<float>(), {shard * n});
    const Tensor part = Tensor::of(b.as<float>(), {shard});
    const double all_reduce = time_op([&] { group.all_reduce(whole); });
    const double all_gather = time_op([&] { group.all_gather(part, whole); });
    const double reduce_scatter = time_op([&] { group.reduce_scatter(whole, part); });
    const Tensor own = whole.view(shard * group.rank(), {shard});
    const double gather_in_place = time_op([&] { group.all_gather(own, whole); });
    const std::vector<std::int64_t> blocks(static_cast<std::size_t>(n), shard);
    const double scatter_in_place = time_op(
        [&] { group.reduce_scatter_blocks_async(whole, blocks, comm::ReduceOp::sum)->wait(); });
    const double size = static_cast<double>(shard * n * 4);
    if (group.rank() == 0)
      fmt::print("{:>10} {:>14.2f} {:>14.2f} {:>14.2f} {:>14.2f} {:>14.2f}\n", shard * n * 4,
                 2 * (ranks - 1) / ranks * size / all_reduce / 1e9,
                 (ranks - 1) / ranks * size / all_gather / 1e9,
                 (ranks - 1) / ranks * size / reduce_scatter / 1e9,
                 (ranks - 1) / ranks * size / gather_in_place / 1e9,
                 (ranks - 1) / ranks * size / scatter_in_place / 1e9);
  }
  return 0;
}
