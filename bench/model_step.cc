// Times full training steps (forward, backward, clipping, AdamW) of the engine on a config
// (default configs/bench.toml; any model.arch and train.precision) with random tokens. For a
// masked-language model (bert) 15% of the targets are kept, the others ignored, as masked-LM
// training has them. Prints one JSON object; bench/run_step_bench.sh compares it with PyTorch
// and divides by the host's peaks (`oases peak`) for MFU.
//
// With --breakdown, one more step runs after the timed ones with a TimeBreakdown installed
// (core/time_breakdown.h): the JSON's "breakdown" has that step's seconds and, per category
// (products, attention, norms, head, optimizer, conversions, elementwise, allocation and
// "unaccounted", the step's time outside every kernel), seconds, share of the step and calls.
// The timed steps run without it, so the breakdown costs them nothing.
//
//   model_step [--config configs/bench.toml] [--steps 5] [--warmup 2] [--set key=value ...]
//              [--breakdown]
#include "core/philox.h"
#include "core/time_breakdown.h"
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

namespace {

// One more training step with a TimeBreakdown installed: its seconds and each category's.
nlohmann::json breakdown_of_one_step(train::TrainingEngine& engine, int step,
                                     const std::vector<std::int32_t>& inputs,
                                     const std::vector<std::int32_t>& targets) {
  TimeBreakdown times;
  double step_seconds = 0;
  {
    const TimeBreakdownScope scope(times);
    const Stopwatch clock;
    engine.train_step(step, inputs.data(), targets.data());
    step_seconds = clock.seconds();
  }
  nlohmann::json categories = nlohmann::json::object();
  const auto entry = [&](double seconds, std::int64_t calls) {
    return nlohmann::json{{"seconds", seconds}, {"share", seconds / step_seconds}, {"calls", calls}};
  };
  for (int c = 0; c < kTimeCategories; ++c) {
    const auto category = static_cast<TimeCategory>(c);
    categories[std::string(time_category_name(category))] =
        entry(times.seconds_of(category), times.calls_of(category));
  }
  categories["unaccounted"] = entry(step_seconds - times.total_seconds(), 0);
  return {{"step_seconds", step_seconds}, {"categories", categories}};
}

}  // namespace

int main(int argc, char** argv) {
  kernels::reexec_with_better_blas_kernels(argv);
  std::string config_path = "configs/bench.toml";
  int steps = 5, warmup = 2;
  bool breakdown = false;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--breakdown") { breakdown = true; continue; }
    if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", flag.c_str()); return 2; }
    const char* value = argv[++i];
    if (flag == "--config") config_path = value;
    else if (flag == "--steps") steps = std::stoi(value);
    else if (flag == "--warmup") warmup = std::stoi(value);
    else if (flag == "--set") overrides.emplace_back(value);
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
    nlohmann::json breakdown_json = nullptr;
    if (breakdown) breakdown_json = breakdown_of_one_step(engine, warmup + steps, inputs, targets);
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
                          {"final_loss", loss},
                          {"peak_rss_bytes", static_cast<std::int64_t>(usage.ru_maxrss) * 1024}};
    if (breakdown) out["breakdown"] = breakdown_json;
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_step: %s\n", e.what());
    return 1;
  }
}
