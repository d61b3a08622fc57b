// Generation speed with and without the key/value cache, side by side in one process, on a
// model of a config (default configs/demo.toml; its weights initialised, not trained: speed
// does not depend on them). Greedy decoding of --tokens new tokens after a short prompt, both
// paths choosing the same tokens; at least --tokens >= seq_len exercises the window sliding.
// Prints one JSON object with tokens/s of each path and their ratio.
//
//   generate_speed [--config configs/demo.toml] [--tokens 256] [--repeats 3] [--set key=value]
#include "core/error.h"
#include "data/tokenizer.h"
#include "kernels/kernels.h"
#include "plan/run_config.h"
#include "train/engine.h"
#include "generate/generate.h"

#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace oases;

int main(int argc, char** argv) {
  kernels::reexec_with_better_blas_kernels(argv);
  std::string config_path = "configs/demo.toml";
  std::int64_t tokens = 256;
  int repeats = 3;
  std::vector<std::string> overrides;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--config") config_path = argv[i + 1];
    else if (flag == "--tokens") tokens = std::stoll(argv[i + 1]);
    else if (flag == "--repeats") repeats = std::stoi(argv[i + 1]);
    else if (flag == "--set") overrides.emplace_back(argv[i + 1]);
    else { std::fprintf(stderr, "unknown flag %s\n", flag.c_str()); return 2; }
  }
  try {
    plan::RunConfig config = plan::load_run_config(config_path, overrides);
    config.train.micro_batch = 1;
    config.train.global_batch = 1;
    config.checkpoint = {};
    const auto tokenizer =
        data::make_tokenizer(config.data.tokenizer, plan::tokenizer_model_path(config));
    train::TrainingEngine engine(config);
    generate::GenerateOptions options;
    options.prompt = "The ";
    options.max_new_tokens = tokens;
    options.sampling.temperature = 0;
    // The best of `repeats` runs of each path, alternating, so that both see the same load.
    double cached = 0, full = 0;
    std::string cached_text, full_text;
    for (int r = 0; r < repeats; ++r) {
      options.kv_cache = true;
      const generate::Generation a = generate::generate(engine, *tokenizer, options);
      options.kv_cache = false;
      const generate::Generation b = generate::generate(engine, *tokenizer, options);
      cached = std::max(cached, a.tokens_per_second());
      full = std::max(full, b.tokens_per_second());
      cached_text = a.samples[0];
      full_text = b.samples[0];
    }
    nlohmann::json out;
    out["config"] = config_path;
    out["arch"] = std::string(model::name(config.model.arch));
    out["precision"] = config.train.precision;
    out["seq_len"] = config.model.seq_len;
    out["new_tokens"] = tokens;
    out["threads"] = omp_get_max_threads();
    out["tokens_per_s_kv_cache"] = cached;
    out["tokens_per_s_full_recompute"] = full;
    out["speedup"] = full > 0 ? cached / full : 0.0;
    out["same_tokens"] = cached_text == full_text;
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
