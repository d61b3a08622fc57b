// The engine side of the PyTorch parity test (parity_test.py). Reads a model config (JSON),
// weights (safetensors, the architecture's Hugging Face names) and a batch, and writes what the
// driver compares, in the run's element type (F64 for precision "fp64", F32 for "fp32"):
//   logits [B, T, V] and loss [1] at the initial weights (logits only in a tensor-parallel
//   group of one: a vocab-parallel head never holds every logit),
//   grad.<name> for every parameter (whole tensor; gradient of the mean loss, before clipping),
//   losses [steps]: the loss before each of `steps` AdamW updates on the same batch,
//   final.<name>: the parameters after those updates.
// With "tp" > 1 it runs on that many MPI ranks (launched by mpirun) as one tensor-parallel
// group; rank 0 writes the output.
#include "comm/job.h"
#include "comm/mesh.h"
#include "comm/mpi_runtime.h"
#include "core/buffer.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/hf_config.h"
#include "train/checkpoint.h"
#include "train/engine.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

using namespace oases;

namespace {

plan::RunConfig run_config(const nlohmann::json& j) {
  plan::RunConfig config;
  config.model.arch = model::parse_architecture(j.value("arch", std::string("gpt")));
  config.model.layers = j.at("layers");
  config.model.hidden = j.at("hidden");
  config.model.heads = j.at("heads");
  config.model.kv_heads = j.value("kv_heads", 0);
  config.model.ffn_hidden = j.at("ffn_hidden");
  config.model.vocab_size = j.at("vocab_size");
  config.model.seq_len = j.at("seq_len");
  config.model.norm_eps = j.value("norm_eps", 0.0);
  config.model.rope_theta = j.value("rope_theta", 10000.0);
  config.model.rope_scaling_factor = j.value("rope_scaling_factor", 0.0);
  config.model.rope_low_freq_factor = j.value("rope_low_freq_factor", 1.0);
  config.model.rope_high_freq_factor = j.value("rope_high_freq_factor", 4.0);
  config.model.rope_original_max_positions = j.value("rope_original_max_positions", 8192);
  config.model.dropout = 0;
  // Mixture of experts (absent keys: a dense model), and the seed that keys its random numbers.
  config.model.moe_every = j.value("moe_every", 0);
  config.model.experts = j.value("experts", 0);
  config.model.moe_gate = ops::parse_moe_gate(j.value("moe_gate", std::string("switch")));
  config.model.moe_top_k = j.value("moe_top_k", 0);
  config.model.capacity_factor = j.value("capacity_factor", 1.0);
  config.model.eval_capacity_factor = j.value("eval_capacity_factor", 0.0);
  config.model.moe_group_size = j.value("moe_group_size", 0);
  config.model.moe_aux_loss_coef = j.value("moe_aux_loss_coef", 0.01);
  config.model.moe_z_loss_coef = j.value("moe_z_loss_coef", 0.0);
  config.model.moe_router_noise = j.value("moe_router_noise", 1.0);
  config.model.expert_dropout = j.value("expert_dropout", 0.0);
  config.model.moe_ffn_hidden = j.value("moe_ffn_hidden", 0);
  if (j.contains("seed")) config.train.seed = j.at("seed");
  config.parallel.tp = j.value("tp", 1);
  config.train.precision = j.value("precision", std::string("fp32"));
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
  return config;
}

std::vector<std::int32_t> read_tokens(const io::SafetensorsFile& batch, const std::string& name,
                                      std::int64_t B, std::int64_t T) {
  const std::vector<std::int64_t> expected{B, T};
  OASES_CHECK(batch.has(name) && batch.info(name).dtype == DType::i32 &&
                  batch.info(name).shape == expected,
              "batch file needs {} as I32 [{}, {}]", name, B, T);
  const auto bytes = batch.read_raw(name);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T));
  std::memcpy(tokens.data(), bytes.data(), bytes.size());
  return tokens;
}

void run(std::map<std::string, std::string>& args, train::ParallelGroups groups, bool writes) {
  std::ifstream config_file(args["--config"]);
  const plan::RunConfig config = run_config(nlohmann::json::parse(config_file));
  comm::Communicator* tp = groups.tp;
  train::TrainingEngine engine(config, groups);
  auto& model = engine.model();
  const std::string& weights = args["--weights"];
  if (model::is_hf_model_folder(weights)) {
    // The folder's config.json must describe the model the driver asked for.
    const model::ModelConfig from_folder = model::read_hf_config(weights).model;
    const model::ModelConfig& asked = config.model;
    OASES_CHECK(from_folder.arch == asked.arch && from_folder.layers == asked.layers &&
                    from_folder.hidden == asked.hidden && from_folder.heads == asked.heads &&
                    from_folder.kv_head_count() == asked.kv_head_count() &&
                    from_folder.ffn_hidden == asked.ffn_hidden &&
                    from_folder.vocab_size == asked.vocab_size &&
                    from_folder.position_count() == asked.seq_len &&
                    from_folder.norm_epsilon() == asked.norm_epsilon() &&
                    from_folder.tied_embeddings() == asked.tied_embeddings() &&
                    from_folder.rope_inverse_frequencies() == asked.rope_inverse_frequencies(),
                "{}/config.json maps onto another model than cfg.json describes", weights);
  }
  train::load_model_weights(weights, config.model, model.layout(), model.params());

  const std::int64_t B = config.train.micro_batch, T = config.model.seq_len,
                     V = config.model.vocab_size;
  const auto batch = io::SafetensorsFile::open(args["--batch"]);
  const auto inputs = read_tokens(batch, "inputs", B, T);
  const auto targets = read_tokens(batch, "targets", B, T);
  const DType dtype = model.dtype();

  io::SafetensorsWriter out;
  if (config.parallel.tp == 1) {
    const Buffer logits(static_cast<std::size_t>(B * T * V) * dtype_size(dtype));
    engine.logits(inputs.data(), logits.tensor(dtype, {B * T, V}));
    out.add_copy("logits", dtype, {B, T, V}, logits.data());
  }
  // An MoE model's objective adds its layers' auxiliary terms to the cross-entropy.
  const double cross_entropy = engine.compute_gradients(0, inputs.data(), targets.data(), B);
  const double loss = cross_entropy + engine.moe_summary().loss;
  const float loss32 = static_cast<float>(loss);
  if (dtype == DType::f64) out.add_copy("loss", dtype, {1}, &loss);
  else out.add_copy("loss", dtype, {1}, &loss32);
  comm::SelfCommunicator self;
  train::add_whole_tensors(out, "grad.", model.layout(), model.grads(), tp ? *tp : self, writes);

  std::vector<double> losses;
  for (std::int64_t step = 0; step < config.train.steps; ++step) {
    const train::StepResult result = engine.train_step(step, inputs.data(), targets.data());
    losses.push_back(result.loss + result.moe.loss);
  }
  const auto n = static_cast<std::int64_t>(losses.size());
  if (dtype == DType::f64) {
    out.add_copy("losses", dtype, {n}, losses.data());
  } else {
    const std::vector<float> narrow(losses.begin(), losses.end());
    out.add_copy("losses", dtype, {n}, narrow.data());
  }
  train::add_whole_tensors(out, "final.", model.layout(), model.params(), tp ? *tp : self, writes);
  if (writes) out.write(args["--out"]);
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  try {
    for (const char* required : {"--config", "--weights", "--batch", "--out"})
      OASES_CHECK(args.count(required), "usage: parity_engine --config cfg.json --weights "
                  "w.safetensors --batch b.safetensors --out o.safetensors (missing {})", required);
    if (!comm::launched_by_mpi()) {
      run(args, {}, true);
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parity_engine: %s\n", e.what());
    return 1;
  }
  comm::MpiRuntime runtime;
  std::optional<comm::Mesh> mesh;
  try {
    mesh.emplace(comm::Mesh::create(runtime, runtime.world_size(), 1, 1));
    run(args, {&mesh->tp_group(), &mesh->dp_group(), {}, {}}, runtime.world_rank() == 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "parity_engine rank %d: %s\n", runtime.world_rank(), e.what());
    comm::abort_job(1);
    return 1;
  }
  return 0;
}
