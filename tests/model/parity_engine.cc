// The engine side of the PyTorch parity test (parity_test.py). Reads a model config (JSON),
// weights (safetensors, HF GPT-2 names) and a batch, and writes what the driver compares:
//   logits [B, T, V] and loss [1] at the initial weights,
//   grad.<name> for every parameter (gradient of the mean loss, before clipping),
//   losses [steps]: the loss before each of `steps` AdamW updates on the same batch,
//   final.<name>: the parameters after those updates.
#include "core/error.h"
#include "train/checkpoint.h"
#include "train/engine.h"
#include "io/safetensors.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace oases;

int main(int argc, char** argv) {
  try {
    std::map<std::string, std::string> args;
    for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
    for (const char* required : {"--config", "--weights", "--batch", "--out"})
      OASES_CHECK(args.count(required), "usage: parity_engine --config cfg.json --weights "
                  "w.safetensors --batch b.safetensors --out o.safetensors (missing {})", required);
    std::ifstream config_file(args["--config"]);
    const nlohmann::json j = nlohmann::json::parse(config_file);

    train::RunConfig config;
    config.model.layers = j.at("layers");
    config.model.hidden = j.at("hidden");
    config.model.heads = j.at("heads");
    config.model.ffn_hidden = j.at("ffn_hidden");
    config.model.vocab_size = j.at("vocab_size");
    config.model.seq_len = j.at("seq_len");
    config.model.dropout = 0;
    config.train.micro_batch = j.at("micro_batch");
    config.train.global_batch = config.train.micro_batch;
    config.train.steps = j.at("steps");
    config.train.lr = j.at("lr");
    config.train.min_lr = config.train.lr;
    config.train.warmup_steps = 0;
    config.train.beta1 = j.at("beta1");
    config.train.beta2 = j.at("beta2");
    config.train.eps = j.at("eps");
    config.train.weight_decay = j.at("weight_decay");
    config.train.grad_clip = j.at("grad_clip");
    config.validate();

    train::TrainingEngine engine(config);
    auto& model = engine.model();
    train::load_model_weights(args["--weights"], model.layout(), model.params());

    const std::int64_t B = config.train.micro_batch, T = config.model.seq_len,
                       V = config.model.vocab_size;
    const auto batch = io::SafetensorsFile::open(args["--batch"]);
    auto read_tokens = [&](const std::string& name) {
      const std::vector<std::int64_t> expected{B, T};
      OASES_CHECK(batch.has(name) && batch.info(name).dtype == DType::i32 &&
                      batch.info(name).shape == expected,
                  "batch file needs {} as I32 [{}, {}]", name, B, T);
      const auto bytes = batch.read_raw(name);
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T));
      std::memcpy(tokens.data(), bytes.data(), bytes.size());
      return tokens;
    };
    const auto inputs = read_tokens("inputs");
    const auto targets = read_tokens("targets");

    io::SafetensorsWriter out;
    std::vector<float> logits(static_cast<std::size_t>(B * T * V));
    engine.logits(inputs.data(), logits.data());
    out.add_copy("logits", DType::f32, {B, T, V}, logits.data());

    const auto loss = static_cast<float>(engine.compute_gradients(0, inputs.data(), targets.data(), B));
    out.add_copy("loss", DType::f32, {1}, &loss);
    for (const auto& p : model.layout().params())
      out.add_copy("grad." + p.name, DType::f32, p.shape.to_vector(), model.grads() + p.offset);

    std::vector<float> losses;
    for (std::int64_t step = 0; step < config.train.steps; ++step)
      losses.push_back(static_cast<float>(engine.train_step(step, inputs.data(), targets.data()).loss));
    out.add_copy("losses", DType::f32, {static_cast<std::int64_t>(losses.size())}, losses.data());
    for (const auto& p : model.layout().params())
      out.add_copy("final." + p.name, DType::f32, p.shape.to_vector(), model.params() + p.offset);
    out.write(args["--out"]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parity_engine: %s\n", e.what());
    return 1;
  }
}
