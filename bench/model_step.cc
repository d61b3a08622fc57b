// Times full training steps (forward, backward, clipping, AdamW) of the engine on a config
// (default configs/bench.toml; any model.arch and train.precision) with random tokens, and
// measures this machine's peak sgemm rate in the same process. For a masked-language model
// (bert) 15% of the targets are kept, the others ignored, as masked-LM training has them.
// Prints one JSON object; bench/run_step_bench.sh compares it with PyTorch.
//
//   model_step [--config configs/bench.toml] [--steps 5] [--warmup 2] [--set key=value ...]
#include "core/philox.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "plan/run_config.h"
#include "train/engine.h"

#include <nlohmann/json.hpp>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace oases;

int main(int argc, char** argv) {
  kernels::reexec_with_better_blas_kernels(argv);
  std::string config_path = "configs/bench.toml";
  int steps = 5, warmup = 2;
  std::vector<std::string> overrides;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--config") config_path = argv[i + 1];
    else if (flag == "--steps") steps = std::stoi(argv[i + 1]);
    else if (flag == "--warmup") warmup = std::stoi(argv[i + 1]);
    else if (flag == "--set") overrides.emplace_back(argv[i + 1]);
    else { std::fprintf(stderr, "unknown flag %s\n", flag.c_str()); return 2; }
  }
  try {
    const plan::RunConfig config = plan::load_run_config(config_path, overrides);
    const std::int64_t rows = config.train.global_batch, seq = config.model.seq_len;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * seq)), targets(inputs.size());
    const PhiloxKey key = philox_key(7, 0);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const auto r = philox4x32({static_cast<std::uint32_t>(i), 0, 0, 0}, key);
      inputs[i] = static_cast<std::int32_t>(r[0] % static_cast<std::uint32_t>(config.model.vocab_size));
      targets[i] = static_cast<std::int32_t>(r[1] % static_cast<std::uint32_t>(config.model.vocab_size));
      if (config.model.masked_lm() && r[2] % 100 >= 15) targets[i] = -1;
    }
    train::TrainingEngine engine(config);
    std::vector<double> times;
    double loss = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      const Stopwatch clock;
      loss = engine.train_step(s, inputs.data(), targets.data()).loss;
      if (s >= warmup) times.push_back(clock.seconds());
    }
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    const double tokens = static_cast<double>(rows * seq);
    const double model_flops = tokens * config.model.training_flops_per_token();
    const double peak = kernels::measure_peak_flops(2048, 2.0);
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    nlohmann::json out = {{"framework", "oases"},
                          {"arch", std::string(model::name(config.model.arch))},
                          {"precision", config.train.precision},
                          {"openblas_core", kernels::blas_kernels_name()},
                          {"threads", omp_get_max_threads()},
                          {"step_seconds_median", median},
                          {"step_seconds_all", times},
                          {"tokens_per_step", rows * seq},
                          {"model_flops_per_step", model_flops},
                          {"model_flops_per_s", model_flops / median},
                          {"peak_sgemm_flops_per_s", peak},
                          {"mfu_vs_sgemm_peak", model_flops / median / peak},
                          {"final_loss", loss},
                          {"peak_rss_bytes", static_cast<std::int64_t>(usage.ru_maxrss) * 1024}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_step: %s\n", e.what());
    return 1;
  }
}
