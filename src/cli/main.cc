// The `oases` command: verbs in the style of git. Every verb has --help.
#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/blas_runtime.h"
#include "train/config.h"
#include "train/generate.h"
#include "train/token_data.h"
#include "train/trainer.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr const char* kVersion = "0.1.0";

int run(int argc, char** argv) {
  CLI::App app{"oases: train transformer language models with overlapped tensor parallelism",
               "oases"};
  app.require_subcommand(1);
  app.set_version_flag("--version", kVersion);

  // train
  std::string config_path, init_from;
  std::vector<std::string> overrides;
  bool print_config = false, quiet = false;
  auto* train = app.add_subcommand("train", "Train a model described by a TOML config");
  train->add_option("--config", config_path, "Run configuration (TOML), e.g. configs/demo.toml")
      ->required();
  train->add_option("--set", overrides,
                    "Override config keys: --set train.lr=3e-4 model.layers=2 (TOML values; "
                    "bare words are strings)");
  train->add_option("--init-from", init_from,
                    "Start from a safetensors file with Hugging Face GPT-2 names and shapes");
  train->add_flag("--print-config", print_config, "Print the resolved config and exit");
  train->add_flag("--quiet", quiet, "No progress output");

  // prepare-data
  std::vector<std::string> inputs;
  std::string output_prefix, tokenizer = "byte";
  double val_fraction = 0.1;
  auto* prepare = app.add_subcommand(
      "prepare-data", "Tokenize text files into <output>_train.bin and <output>_val.bin shards");
  prepare->add_option("--input", inputs, "Text files, read in order")->required();
  prepare->add_option("--output", output_prefix, "Shard prefix, e.g. data/corpus")->required();
  prepare->add_option("--val-fraction", val_fraction,
                      "Fraction of tokens (the last ones) kept for validation")
      ->capture_default_str();
  prepare->add_option("--tokenizer", tokenizer, "Tokenizer: byte")
      ->capture_default_str();

  // generate
  oases::train::GenerateOptions gen;
  auto* generate = app.add_subcommand("generate", "Sample text from a checkpoint");
  generate->add_option("--checkpoint", gen.checkpoint,
                       "A step_N checkpoint directory, a run's checkpoint.dir (newest is used) "
                       "or a model.safetensors written by oases")
      ->required();
  generate->add_option("--prompt", gen.prompt, "Text to continue")->required();
  generate->add_option("--max-new-tokens", gen.max_new_tokens, "Tokens to generate")
      ->capture_default_str();
  generate->add_option("--temperature", gen.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str();
  generate->add_option("--top-k", gen.top_k, "Sample among the k likeliest tokens (0: all)")
      ->capture_default_str();
  generate->add_option("--seed", gen.seed, "Seed of the sampling draws")
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);

  if (*train) {
    const auto config = oases::train::load_run_config(config_path, overrides);
    if (print_config) {
      fmt::print("{}\n", oases::train::to_toml(config));
      return 0;
    }
    oases::train::TrainOptions options;
    options.init_from = init_from;
    options.progress = !quiet;
    const auto summary = oases::train::run_training(config, options);
    if (!quiet && summary.initial_val_loss && summary.final_val_loss)
      oases::log_info("validation loss {:.4f} -> {:.4f}", *summary.initial_val_loss,
                      *summary.final_val_loss);
  } else if (*prepare) {
    const auto s = oases::train::prepare_data(inputs, output_prefix, val_fraction, tokenizer);
    fmt::print("prepared {} tokens ({} tokenizer, vocab {}) from {} bytes: {} train tokens -> "
               "{}, {} validation tokens -> {}\n",
               s.total_tokens, s.tokenizer, s.vocab_size, s.input_bytes, s.train_tokens,
               s.train_path, s.val_tokens, s.val_path);
  } else if (*generate) {
    fmt::print("{}\n", oases::train::generate_text(gen));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  oases::kernels::cpu::reexec_with_better_openblas_core(argv);
  try {
    return run(argc, argv);
  } catch (const oases::UserError& e) {
    oases::log_error("{}", e.what());
    return 2;
  } catch (const oases::InternalError& e) {
    oases::log_error("{}\nthis is a bug in oases; please report it with the command line", e.what());
    return 3;
  } catch (const std::exception& e) {
    oases::log_error("{}", e.what());
    return 1;
  }
}
