// What the flight recorder adds to one collective: small all-reduces (8 bytes, where a fixed
// cost shows most) on two communicators over the same ranks, one without a recorder and one
// with a ring and an issuer label per operation, as the executor issues them. Batches of each
// alternate over ROUNDS rounds; prints the median time per all-reduce of each and the
// difference. Run under mpirun (bench/run_straggler_overhead.sh says how it adds up per step).
//   mpirun -np 2 build/release/flight_recorder_cost [ROUNDS=9] [OPS=4000]
#include "comm/flight_recorder.h"
#include "comm/mpi_communicator.h"
#include "comm/mpi_runtime.h"
#include "core/timer.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

using namespace oases;

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 9;
  const int ops = argc > 2 ? std::atoi(argv[2]) : 4000;
  comm::MpiRuntime runtime;
  const auto folder = std::filesystem::temp_directory_path() / "oases_flight_cost";
  auto recorder = std::make_shared<comm::FlightRecorder>(
      folder.string(),
      comm::FlightIdentity{runtime.world_rank(), runtime.world_size(), "bench", {}});
  comm::MpiCommunicatorOptions plain_options, recorded_options;
  recorded_options.flight = recorder;
  comm::MpiCommunicator plain(MPI_COMM_WORLD, "plain", plain_options);
  comm::MpiCommunicator recorded(MPI_COMM_WORLD, "recorded", recorded_options);

  double value = 1;
  const Tensor buffer = Tensor::of(&value, {1});
  const auto batch = [&](comm::Communicator& group, bool label) {
    group.barrier();
    const Stopwatch clock;
    for (int i = 0; i < ops; ++i) {
      std::unique_ptr<comm::Work> work;
      if (label) {
        const comm::IssuerLabel issuer(group, fmt::format("Start(fwd, seg={}, mb=0, sb=0)", i % 8));
        work = group.all_reduce_async(buffer, comm::ReduceOp::max);
      } else {
        work = group.all_reduce_async(buffer, comm::ReduceOp::max);
      }
      work->wait();
    }
    return clock.seconds() / ops;
  };
  std::vector<double> without, with;
  batch(plain, false);  // warm-up
  batch(recorded, true);
  for (int r = 0; r < rounds; ++r) {
    without.push_back(batch(plain, false));
    with.push_back(batch(recorded, true));
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  if (runtime.world_rank() == 0)
    fmt::print("all_reduce of 8 bytes on {} ranks, median of {} rounds of {}:\n"
               "  without recorder {:8.2f} us\n  with recorder    {:8.2f} us\n"
               "  difference       {:8.2f} us per operation ({:+.1f}%)\n",
               runtime.world_size(), rounds, ops, median(without) * 1e6, median(with) * 1e6,
               (median(with) - median(without)) * 1e6,
               (median(with) / median(without) - 1) * 100);
  std::filesystem::remove_all(folder);
  return 0;
}
