// Hugging Face model folders in and out (docs/fine-tuning.md): folders made here in the exact
// on-disk formats (config.json as transformers writes it for each class, weights sharded with
// model.safetensors.index.json, the buffers real folders carry) for tiny GPT-2, LLaMA (grouped
// key/value heads, a rotary base and LLaMA 3 frequency scaling, an untied head, bf16 weights)
// and BERT models:
//  - `oases train --init-from DIR` trains 3 steps in fp64 exactly as the same weights given
//    through a safetensors file with an explicit [model] section;
//  - `oases export` of the folder writes tensors bit for bit equal and the same config, and
//    exporting the export again writes the same files; a trained checkpoint exports in bf16;
//  - a missing shard, a tensor in two shards, a dtype the run cannot take, a tensor the model
//    has no use for and a setting that disagrees with config.json are errors saying so.
#include "core/dtype.h"
#include "data/tokenizer.h"
#include "io/safetensors.h"
#include "io/safetensors_set.h"
#include "model/hf_config.h"
#include "model/model.h"
#include "support/command.h"
#include "support/files.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using nlohmann::json;
using oases::testing::read_bytes;
using oases::testing::run_command;
using Result = oases::testing::CommandResult;

constexpr std::int64_t kVocab = 263, kPositions = 32, kSeqLen = 20;

// The [model] section of the reference run and the config.json of the same model.
struct ModelCase {
  std::string arch;
  std::string model_toml;
  json config;
  bool bf16_weights = false;
};

ModelCase model_case(const std::string& arch) {
  if (arch == "gpt")
    return {arch,
            "arch = \"gpt\"\nlayers = 2\nhidden = 64\nheads = 4\nffn_hidden = 96\n"
            "vocab_size = 263\nmax_positions = 32\ndropout = 0.1\n",
            {{"architectures", {"GPT2LMHeadModel"}},
             {"model_type", "gpt2"},
             {"activation_function", "gelu_new"},
             {"attn_pdrop", 0.0},
             {"embd_pdrop", 0.1},
             {"resid_pdrop", 0.1},
             {"bos_token_id", 10},
             {"eos_token_id", 10},
             {"initializer_range", 0.02},
             {"layer_norm_epsilon", 1e-5},
             {"n_ctx", kPositions},
             {"n_embd", 64},
             {"n_head", 4},
             {"n_inner", 96},
             {"n_layer", 2},
             {"n_positions", kPositions},
             {"reorder_and_upcast_attn", false},
             {"scale_attn_by_inverse_layer_idx", false},
             {"scale_attn_weights", true},
             {"summary_activation", nullptr},
             {"summary_first_dropout", 0.1},
             {"summary_proj_to_labels", true},
             {"summary_type", "cls_index"},
             {"summary_use_proj", true},
             {"torch_dtype", "float32"},
             {"transformers_version", "4.44.0"},
             {"use_cache", true},
             {"vocab_size", kVocab}}};
  if (arch == "llama")
    return {arch,
            "arch = \"llama\"\nlayers = 2\nhidden = 64\nheads = 4\nkv_heads = 2\n"
            "ffn_hidden = 96\nvocab_size = 263\nmax_positions = 64\nrope_theta = 500\n"
            "norm_eps = 1e-6\ntie_embeddings = false\nrope_scaling_factor = 4\n"
            "rope_low_freq_factor = 1\nrope_high_freq_factor = 4\n"
            "rope_original_max_positions = 64\ndropout = 0.1\n",
            {{"architectures", {"LlamaForCausalLM"}},
             {"model_type", "llama"},
             {"attention_bias", false},
             {"attention_dropout", 0.0},
             {"bos_token_id", 256},
             {"eos_token_id", {257, 258}},
             {"head_dim", 16},
             {"hidden_act", "silu"},
             {"hidden_size", 64},
             {"initializer_range", 0.02},
             {"intermediate_size", 96},
             {"max_position_embeddings", 64},
             {"mlp_bias", false},
             {"num_attention_heads", 4},
             {"num_hidden_layers", 2},
             {"num_key_value_heads", 2},
             {"pretraining_tp", 1},
             {"rms_norm_eps", 1e-6},
             {"rope_scaling",
              {{"factor", 4.0},
               {"high_freq_factor", 4.0},
               {"low_freq_factor", 1.0},
               {"original_max_position_embeddings", 64},
               {"rope_type", "llama3"}}},
             {"rope_theta", 500.0},
             {"tie_word_embeddings", false},
             {"torch_dtype", "bfloat16"},
             {"transformers_version", "4.45.0"},
             {"use_cache", true},
             {"vocab_size", kVocab}},
            true};
  return {arch,
          "arch = \"bert\"\nlayers = 2\nhidden = 64\nheads = 4\nffn_hidden = 96\n"
          "vocab_size = 263\nmax_positions = 32\ndropout = 0.1\nattention_dropout = 0.1\n",
          {{"architectures", {"BertForMaskedLM"}},
           {"model_type", "bert"},
           {"attention_probs_dropout_prob", 0.1},
           {"gradient_checkpointing", false},
           {"hidden_act", "gelu"},
           {"hidden_dropout_prob", 0.1},
           {"hidden_size", 64},
           {"initializer_range", 0.02},
           {"intermediate_size", 96},
           {"layer_norm_eps", 1e-12},
           {"max_position_embeddings", kPositions},
           {"num_attention_heads", 4},
           {"num_hidden_layers", 2},
           {"pad_token_id", 0},
           {"position_embedding_type", "absolute"},
           {"transformers_version", "4.6.0"},
           {"type_vocab_size", 2},
           {"use_cache", true},
           {"vocab_size", kVocab}}};
}

// bf16 rounding of a float (round to nearest even), and back.
float bf16_round(float x) {
  return oases::bf16_bits_to_float(oases::float_to_bf16_bits(x));
}

class ModelFolder : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = oases::testing::fresh_test_folder("model_folder_runs");
    const Result r = oases::testing::prepare_fortunes_data(OASES_BINARY, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    case_ = model_case(GetParam());
    const std::string training =
        "[train]\nprecision = \"fp64\"\nmicro_batch = 4\n"
        "global_batch = 8\nsteps = 3\nlr = 3e-3\nthreads = 1\n"
        "[data]\npath = \"" +
        (dir_ / "data").string() + "\"\n";
    std::ofstream(dir_ / "tiny.toml") << "[model]\n"
                                      << case_.model_toml << "seq_len = " << kSeqLen << "\n"
                                      << training;
    // The folder's run states only what a fine-tuning user would: the sequence length, and
    // LLaMA's dropout (its config.json has none).
    std::ofstream(dir_ / "finetune.toml")
        << "[model]\nseq_len = " << kSeqLen << "\n"
        << (GetParam() == "llama" ? "dropout = 0.1\n" : "") << training;
    oases::testing::write_random_init(dir_ / "tiny.toml", dir_ / "random.safetensors", 41);
    write_folder();
  }

  // The folder: config.json, the weights in shards of at most ~24 KB with their index (GPT-2's
  // under "transformer.", with its attention-mask buffers; BERT's with position_ids, a pooler
  // and a next-sentence head), and init.safetensors: the same values under oases' names, the
  // reference run's start.
  void write_folder() {
    const fs::path folder = dir_ / "hf";
    fs::create_directories(folder);
    std::ofstream(folder / "config.json") << case_.config.dump(2);
    const oases::io::SafetensorsFile random =
        oases::io::SafetensorsFile::open((dir_ / "random.safetensors").string());
    const oases::model::ModelConfig model =
        oases::model::parse_hf_config(case_.config, "config.json").model;
    std::vector<std::pair<std::string, std::vector<float>>> tensors;  // folder name, values
    oases::io::SafetensorsWriter init;
    std::map<std::string, std::vector<std::int64_t>> shapes;
    for (const std::string& name : random.names()) {
      const std::vector<std::int64_t> shape = random.info(name).shape;
      std::vector<float> values(static_cast<std::size_t>(random.info(name).numel()));
      random.read_f32(name, shape, values.data());
      if (case_.bf16_weights)
        for (float& v : values) v = bf16_round(v);
      init.add_copy(name, oases::DType::f32, shape, values.data());
      const std::string stored = oases::model::hf_tensor_name(model, name);
      shapes[stored] = shape;
      tensors.emplace_back(stored, std::move(values));
    }
    init.write((dir_ / "init.safetensors").string());

    // Shards in name order, a new one past 24 KB, as save_pretrained cuts them.
    std::vector<oases::io::SafetensorsWriter> shards(1);
    std::vector<std::vector<std::string>> shard_names(1);
    std::vector<std::vector<std::uint16_t>> halves;
    halves.reserve(tensors.size());
    std::size_t bytes = 0;
    for (const auto& [name, values] : tensors) {
      const std::size_t size = values.size() * (case_.bf16_weights ? 2 : 4);
      if (bytes > 0 && bytes + size > 24'000) {
        shards.emplace_back();
        shard_names.emplace_back();
        bytes = 0;
      }
      if (case_.bf16_weights) {
        halves.emplace_back();
        for (float v : values) halves.back().push_back(oases::float_to_bf16_bits(v));
        shards.back().add(name, oases::DType::bf16, shapes[name], halves.back().data());
      } else {
        shards.back().add(name, oases::DType::f32, shapes[name], values.data());
      }
      shard_names.back().push_back(name);
      bytes += size;
    }
    // Buffers and heads real folders carry, which the model does not use.
    std::vector<float> mask(kPositions * kPositions, 1.0f), pooler(64 * 64, 0.5f);
    std::vector<std::int64_t> position_ids(kPositions);
    if (GetParam() == "gpt") {
      shards.back().add("transformer.h.0.attn.bias", oases::DType::f32,
                        {1, 1, kPositions, kPositions}, mask.data());
      shard_names.back().push_back("transformer.h.0.attn.bias");
    }
    if (GetParam() == "bert") {
      shards.back().add("bert.embeddings.position_ids", oases::DType::i64, {1, kPositions},
                        position_ids.data());
      shards.back().add("bert.pooler.dense.weight", oases::DType::f32, {64, 64}, pooler.data());
      shard_names.back().push_back("bert.embeddings.position_ids");
      shard_names.back().push_back("bert.pooler.dense.weight");
    }
    ASSERT_GE(shards.size(), 3u) << "the folder should be sharded";
    json weight_map = json::object();
    std::uint64_t total = 0;
    for (std::size_t k = 0; k < shards.size(); ++k) {
      const std::string file = "model-" + std::string(5 - std::to_string(k + 1).size(), '0') +
                               std::to_string(k + 1) + "-of-" +
                               std::string(5 - std::to_string(shards.size()).size(), '0') +
                               std::to_string(shards.size()) + ".safetensors";
      shards[k].set_metadata("format", "pt");
      shards[k].write((folder / file).string());
      const auto written = oases::io::SafetensorsFile::open((folder / file).string());
      for (const std::string& name : shard_names[k]) {
        weight_map[name] = file;
        total += written.info(name).nbytes();
      }
    }
    std::ofstream(folder / "model.safetensors.index.json")
        << json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2);
  }

  oases::model::ModelConfig case_model() const {
    return oases::model::parse_hf_config(case_.config, "config.json").model;
  }

  Result oases(const std::string& arguments) const {
    return run_command(std::string(OASES_BINARY) + " " + arguments);
  }

  // `oases train` of `config` from `init` into dir_/name.
  fs::path train(const std::string& config, const fs::path& init, const std::string& name,
                 const std::string& extra = "") const {
    const fs::path out = dir_ / name;
    const Result r = oases(
        "train --quiet --config " + (dir_ / config).string() + " --init-from " + init.string() +
        " --set log.metrics=" + oases::testing::quoted((out / "metrics.jsonl").string()) +
        " checkpoint.dir=" + oases::testing::quoted((out / "ckpt").string()) +
        " checkpoint.every=3 " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }

  fs::path dir_;
  ModelCase case_;
};

TEST_P(ModelFolder, TrainsAsTheSameWeightsGivenThroughAFile) {
  const fs::path reference = train("tiny.toml", dir_ / "init.safetensors", "reference");
  const fs::path from_folder = train("finetune.toml", dir_ / "hf", "from_folder");
  const auto want = oases::testing::metric_values(reference / "metrics.jsonl", "loss");
  ASSERT_EQ(want.size(), 3u);
  // The same numbers in the same order: equal, not merely close.
  EXPECT_EQ(oases::testing::metric_values(from_folder / "metrics.jsonl", "loss"), want);
  oases::testing::expect_same_tensors(from_folder / "ckpt" / "step_3" / "model.safetensors",
                                      reference / "ckpt" / "step_3" / "model.safetensors",
                                      GetParam() + " from its folder", 0.0);
  if (GetParam() != "bert") return;
  // bert-base-uncased's own file names LayerNorm's parameters gamma and beta: the same folder
  // with those names trains the same.
  const fs::path old_names = dir_ / "hf_old_names";
  fs::create_directories(old_names);
  fs::copy_file(dir_ / "hf" / "config.json", old_names / "config.json");
  json index = json::parse(read_bytes((dir_ / "hf" / "model.safetensors.index.json").string()));
  json renamed = json::object();
  const auto old_name = [](std::string name) {
    if (name.find("LayerNorm.") == std::string::npos) return name;
    if (name.ends_with(".weight")) return name.substr(0, name.size() - 7) + ".gamma";
    if (name.ends_with(".bias")) return name.substr(0, name.size() - 5) + ".beta";
    return name;
  };
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    renamed[old_name(name)] = file;
    shards.insert(file.get<std::string>());
  }
  for (const std::string& shard : shards) {
    const auto in = oases::io::SafetensorsFile::open((dir_ / "hf" / shard).string());
    oases::io::SafetensorsWriter out;
    for (const std::string& name : in.names()) {
      const std::vector<std::byte> bytes = in.read_raw(name);
      out.add_copy(old_name(name), in.info(name).dtype, in.info(name).shape, bytes.data());
    }
    out.write((old_names / shard).string());
  }
  index["weight_map"] = renamed;
  std::ofstream(old_names / "model.safetensors.index.json") << index.dump();
  const fs::path from_old = train("finetune.toml", old_names, "from_old_names");
  EXPECT_EQ(oases::testing::metric_values(from_old / "metrics.jsonl", "loss"), want);
}

TEST_P(ModelFolder, ExportsBitForBitAndReadsBackTheSameConfig) {
  const fs::path folder = dir_ / "hf";
  const Result first = oases("export --checkpoint " + folder.string() + " --output " +
                             (dir_ / "exported").string() + " --shard-size 20KB");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto source = oases::io::SafetensorsSet::open(folder.string());
  const auto exported = oases::io::SafetensorsSet::open((dir_ / "exported").string());
  EXPECT_TRUE(exported.sharded());
  for (const std::string& name : exported.names()) {
    ASSERT_TRUE(source.has(name)) << name;
    EXPECT_EQ(exported.info(name).dtype, source.info(name).dtype) << name;
    EXPECT_EQ(exported.read_raw(name), source.read_raw(name)) << name;
  }
  // Every tensor the model uses, and nothing else (buffers dropped).
  const auto model = oases::model::read_hf_config(folder.string());
  for (const std::string& name : source.names())
    EXPECT_EQ(exported.has(name), !oases::model::hf_unused_tensor(model.model, name)) << name;
  const auto again = oases::model::read_hf_config((dir_ / "exported").string());
  EXPECT_EQ(again.architecture, model.architecture);
  // A config that states no dtype gets the one the folder's tensors have.
  EXPECT_EQ(again.torch_dtype, model.torch_dtype.empty() ? "float32" : model.torch_dtype);
  EXPECT_EQ(again.eos_token_id, model.eos_token_id);
  EXPECT_EQ(again.model.parameter_count(), model.model.parameter_count());
  EXPECT_EQ(again.model.rope_inverse_frequencies().size(),
            model.model.rope_inverse_frequencies().size());
  if (GetParam() == "llama") {
    EXPECT_EQ(again.model.rope_inverse_frequencies(), model.model.rope_inverse_frequencies());
  }
  EXPECT_EQ(fs::exists(dir_ / "exported" / "generation_config.json"), GetParam() != "bert");

  // The export exported again: the same files, byte for byte.
  const Result second = oases("export --checkpoint " + (dir_ / "exported").string() + " --output " +
                              (dir_ / "exported_again").string() + " --shard-size 20KB");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  for (const auto& entry : fs::directory_iterator(dir_ / "exported"))
    EXPECT_EQ(read_bytes(entry.path().string()),
              read_bytes((dir_ / "exported_again" / entry.path().filename()).string()))
        << entry.path().filename();
}

TEST_P(ModelFolder, ExportsATrainedCheckpointInBf16) {
  const fs::path run =
      train("finetune.toml", dir_ / "hf", "trained", "train.steps=1 checkpoint.every=1");
  const Result r = oases("export --checkpoint " + (run / "ckpt").string() + " --output " +
                         (dir_ / "out").string() + " --dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("bfloat16"), std::string::npos) << r.output;
  const auto checkpoint =
      oases::io::SafetensorsFile::open((run / "ckpt" / "step_1" / "model.safetensors").string());
  const auto out = oases::io::SafetensorsSet::open((dir_ / "out").string());
  EXPECT_FALSE(out.sharded());
  const auto config = oases::model::read_hf_config((dir_ / "out").string());
  EXPECT_EQ(config.torch_dtype, "bfloat16");
  for (const std::string& name : checkpoint.names()) {
    const std::string stored = oases::model::hf_tensor_name(config.model, name);
    ASSERT_TRUE(out.has(stored)) << stored;
    EXPECT_EQ(out.info(stored).dtype, oases::DType::bf16);
    const auto shape = checkpoint.info(name).shape;
    std::vector<double> trained(static_cast<std::size_t>(checkpoint.info(name).numel()));
    std::vector<float> written(trained.size());
    checkpoint.read_f64(name, shape, trained.data());
    out.read_f32(stored, shape, written.data());
    // fp64 master weights, rounded once to bf16 (8 significant bits): within half an ulp,
    // 2^-8 of the value.
    for (std::size_t i = 0; i < trained.size(); ++i)
      EXPECT_LE(std::abs(written[i] - trained[i]), std::abs(trained[i]) * 0x1p-8) << stored;
  }
  // And the exported folder starts a run.
  const fs::path again = train("finetune.toml", dir_ / "out", "from_export", "train.steps=1");
  EXPECT_EQ(oases::testing::metric_values(again / "metrics.jsonl", "loss").size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Architectures, ModelFolder, ::testing::Values("gpt", "llama", "bert"),
                         [](const ::testing::TestParamInfo<std::string>& test) {
                           return test.param;
                         });

// Folders that are wrong in one way each, and settings that disagree with config.json.
class BrokenModelFolder : public ModelFolder {
 protected:
  std::string refused_name_;  // the tensor stored as integers
};

TEST_P(BrokenModelFolder, IsRefusedSayingWhy) {
  const fs::path folder = dir_ / "hf";
  const auto refused = [&](const std::string& extra, const std::vector<std::string>& parts) {
    const Result r =
        oases("train --quiet --config " + (dir_ / "finetune.toml").string() + " --init-from " +
              folder.string() + " --set train.steps=1 " +
              "checkpoint.dir=" + oases::testing::quoted((dir_ / "ck").string()) + " " + extra);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    for (const std::string& part : parts)
      EXPECT_NE(r.output.find(part), std::string::npos) << "no '" << part << "' in " << r.output;
  };
  // A setting that disagrees with the folder's config.json.
  refused("model.hidden=128", {"model.hidden = 128", "config.json gives 64"});
  refused("model.layers=3", {"model.layers = 3", "gives 2"});

  const json index = json::parse(read_bytes((folder / "model.safetensors.index.json").string()));
  const std::string first_shard = index["weight_map"].begin().value().get<std::string>();
  // A tensor in two shards: the first shard copied over the second.
  std::string second_shard;
  for (const auto& [name, file] : index["weight_map"].items())
    if (file != first_shard) second_shard = file.get<std::string>();
  fs::copy_file(folder / second_shard, dir_ / "saved_shard");
  fs::copy_file(folder / first_shard, folder / second_shard, fs::copy_options::overwrite_existing);
  refused("", {"in that one too", "exactly one shard"});
  fs::copy_file(dir_ / "saved_shard", folder / second_shard, fs::copy_options::overwrite_existing);
  // A missing shard.
  fs::rename(folder / first_shard, dir_ / "moved_shard");
  refused("", {first_shard, "missing"});
  fs::rename(dir_ / "moved_shard", folder / first_shard);
  // A weight stored as integers.
  {
    const auto shard = oases::io::SafetensorsFile::open((folder / first_shard).string());
    oases::io::SafetensorsWriter rewritten;
    std::vector<std::vector<std::byte>> keep;
    bool changed = false;
    for (const std::string& name : shard.names()) {
      keep.push_back(shard.read_raw(name));
      const auto& info = shard.info(name);
      const bool make_int = !changed && dtype_size(info.dtype) == 4 &&
                            !oases::model::hf_unused_tensor(case_model(), name);
      rewritten.add(name, make_int ? oases::DType::i32 : info.dtype, info.shape,
                    keep.back().data());
      if (make_int) {
        refused_name_ = name;
        changed = true;
      }
    }
    if (changed) {
      fs::copy_file(folder / first_shard, dir_ / "saved_first",
                    fs::copy_options::overwrite_existing);
      rewritten.write((folder / first_shard).string());
      refused("", {refused_name_, "I32", "cannot be read as floating-point"});
      fs::copy_file(dir_ / "saved_first", folder / first_shard,
                    fs::copy_options::overwrite_existing);
    }
  }
  // A tensor the model has no parameter for.
  {
    std::vector<float> extra(4, 1.0f);
    oases::io::SafetensorsWriter writer;
    writer.add("stray.weight", oases::DType::f32, {4}, extra.data());
    writer.write((folder / "stray.safetensors").string());
    json with_stray = index;
    with_stray["weight_map"]["stray.weight"] = "stray.safetensors";
    with_stray.erase("metadata");
    std::ofstream(folder / "model.safetensors.index.json") << with_stray.dump();
    refused("", {"'stray.weight'", "no parameter"});
    std::ofstream(folder / "model.safetensors.index.json") << index.dump();
  }
  // An architecture oases does not compute.
  json other = case_.config;
  other["architectures"] = {"MistralForCausalLM"};
  std::ofstream(folder / "config.json") << other.dump();
  refused("", {"MistralForCausalLM", "not one oases computes"});
}

INSTANTIATE_TEST_SUITE_P(Architectures, BrokenModelFolder, ::testing::Values("gpt", "llama"),
                         [](const ::testing::TestParamInfo<std::string>& test) {
                           return test.param;
                         });

}  // namespace

namespace {

// A Hugging Face folder of a tiny LLaMA with LLaMA 3's tokenizer (from the cache that
// scripts/install-deps.sh fills): prepare-data takes the folder's tokenizer, and generate and
// eval read the folder as a checkpoint. An untrained model's loss is about ln(vocabulary).
TEST(ModelFolderWithTokenizer, PreparesDataGeneratesAndEvaluates) {
  const fs::path llama3 = fs::path(oases::data::oases_cache_dir()) / "tokenizers" / "llama3";
  if (!fs::exists(llama3 / "tokenizer.json"))
    GTEST_SKIP() << "no LLaMA 3 tokenizer at " << llama3 << "; bash scripts/install-deps.sh";
  const fs::path dir = oases::testing::fresh_test_folder("model_folder_runs");
  const fs::path folder = dir / "llama";
  fs::create_directories(folder);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(llama3 / file, folder / file);
  const json config = {{"architectures", {"LlamaForCausalLM"}},
                       {"model_type", "llama"},
                       {"hidden_size", 32},
                       {"intermediate_size", 64},
                       {"num_attention_heads", 2},
                       {"num_hidden_layers", 1},
                       {"num_key_value_heads", 1},
                       {"max_position_embeddings", 64},
                       {"rms_norm_eps", 1e-5},
                       {"rope_theta", 500000.0},
                       {"tie_word_embeddings", true},
                       {"vocab_size", 128256},
                       {"bos_token_id", 128000},
                       {"eos_token_id", 128001}};
  std::ofstream(folder / "config.json") << config.dump();
  const oases::model::ModelConfig model =
      oases::model::parse_hf_config(config, "config.json").model;
  const oases::model::ParamLayout layout = oases::model::model_param_layout(model);
  std::vector<float> values(static_cast<std::size_t>(layout.total_numel()));
  oases::io::SafetensorsWriter writer;
  for (const auto& p : layout.params()) {
    const bool norm = p.name.find("norm") != std::string::npos;
    for (std::int64_t i = 0; i < p.numel(); ++i)
      values[static_cast<std::size_t>(p.offset + i)] =
          norm ? 1.0f : 0.001f * static_cast<float>((i * 7919 + p.offset) % 17 - 8);
    writer.add(p.name, oases::DType::f32, p.full_shape.to_vector(), values.data() + p.offset);
  }
  writer.write((folder / "model.safetensors").string());

  const std::string binary = OASES_BINARY;
  Result r =
      run_command(binary + " prepare-data --input /usr/share/games/fortunes/fortunes " +
                  "--output " + (dir / "data").string() + " --tokenizer-model " + folder.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("bpe tokenizer, vocab 128256"), std::string::npos) << r.output;
  r = run_command(binary + " generate --checkpoint " + folder.string() +
                  " --prompt Hello --max-new-tokens 4 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("Hello", 0), 0u) << r.output;
  // Windows of the folder's 64 positions.
  r = run_command(binary + " eval --json --checkpoint " + folder.string() + " --data " +
                  (dir / "data").string() + " --batches 1 --batch-size 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json result = json::parse(r.output.substr(r.output.find('{')));
  EXPECT_NEAR(result["loss"].get<double>(), std::log(128256.0), 0.5) << r.output;
}

}  // namespace
