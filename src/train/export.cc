#include "train/export.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "core/tensor.h"
#include "data/tokenizer.h"
#include "io/checkpoint_dir.h"
#include "io/safetensors_set.h"
#include "kernels/kernels.h"
#include "model/hf_config.h"
#include "model/model.h"
#include "train/checkpoint.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

namespace oases::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct DTypeWords {
  DType dtype;
  const char* short_name;
  const char* torch_name;
};
constexpr DTypeWords kExportDTypes[] = {
    {DType::bf16, "bf16", "bfloat16"},
    {DType::f16, "fp16", "float16"},
    {DType::f32, "fp32", "float32"},
    {DType::f64, "fp64", "float64"},
};

const char* torch_dtype_name(DType dtype) {
  for (const DTypeWords& d : kExportDTypes)
    if (d.dtype == dtype) return d.torch_name;
  OASES_FAIL("no torch dtype for {}", dtype_name(dtype));
}

void write_json(const fs::path& path, const json& value) {
  AtomicFileWriter file(path.string());
  file.write(value.dump(2) + "\n");
  file.commit();
}

// What the export reads: the model, where its tensors are, and what the folder keeps of it.
struct Source {
  model::ModelConfig model;
  std::unique_ptr<io::SafetensorsSet> tensors;
  bool hf_folder = false;
  json bos_token_id, eos_token_id, pad_token_id;
  std::vector<data::TokenizerFile> tokenizer_files;
};

// A Hugging Face folder's tokenizer files, as they are.
std::vector<data::TokenizerFile> folder_tokenizer_files(const fs::path& dir) {
  std::vector<data::TokenizerFile> files;
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
        "vocab.txt", "vocab.json", "merges.txt", "added_tokens.json"}) {
    std::error_code ec;
    if (!fs::is_regular_file(dir / name, ec)) continue;
    files.push_back(
        {name, read_regular_file((dir / name).string(), "tokenizer file", std::uint64_t{1} << 32)});
  }
  return files;
}

// tokenizer_config.json for a tokenizer whose files carry none, naming the transformers class
// that reads them: GPT-2's vocab.json and merges.txt (GPT2Tokenizer), a SentencePiece model
// (LlamaTokenizer, adding nothing: the shards were made without begin or end tokens), a
// tokenizer.json (PreTrainedTokenizerFast), a vocab.txt (BertTokenizer).
std::optional<data::TokenizerFile> tokenizer_config_for(
    const data::Tokenizer& tokenizer, const std::vector<data::TokenizerFile>& files,
    std::int64_t positions) {
  const auto has = [&](std::string_view name) {
    return std::any_of(files.begin(), files.end(),
                       [&](const data::TokenizerFile& f) { return f.name == name; });
  };
  if (files.empty() || has("tokenizer_config.json")) return std::nullopt;
  json config = {{"model_max_length", positions}};
  const auto token_text = [&](std::optional<std::int32_t> id) -> json {
    if (!id) return json();
    const std::int32_t one[] = {*id};
    return tokenizer.decode(one);
  };
  if (has("vocab.json") && has("merges.txt")) {
    config["tokenizer_class"] = "GPT2Tokenizer";
    config["add_prefix_space"] = false;
    const json end = token_text(tokenizer.document_separator());
    config["bos_token"] = end;
    config["eos_token"] = end;
    config["unk_token"] = end;
  } else if (has("tokenizer.model")) {
    config["tokenizer_class"] = "LlamaTokenizer";
    config["add_bos_token"] = tokenizer.begin_of_sequence().has_value();
    config["add_eos_token"] = false;
    config["legacy"] = true;
    for (const char* special : {"<s>", "</s>", "<unk>"})
      if (tokenizer.special_token_id(special)) {
        const std::string key = std::string(special) == "<s>"    ? "bos_token"
                                : std::string(special) == "</s>" ? "eos_token"
                                                                 : "unk_token";
        config[key] = special;
      }
  } else if (has("tokenizer.json")) {
    config["tokenizer_class"] = "PreTrainedTokenizerFast";
  } else if (has("vocab.txt")) {
    config["tokenizer_class"] = "BertTokenizer";
  }
  return data::TokenizerFile{"tokenizer_config.json", config.dump(2) + "\n"};
}

Source open_source(const std::string& path) {
  Source source;
  if (model::is_hf_model_folder(path)) {
    const model::HfConfig hf = model::read_hf_config(path);
    source.model = hf.model;
    source.hf_folder = true;
    source.bos_token_id = hf.bos_token_id;
    source.eos_token_id = hf.eos_token_id;
    source.pad_token_id = hf.pad_token_id;
    source.tensors = std::make_unique<io::SafetensorsSet>(io::SafetensorsSet::open(path));
    source.tokenizer_files = folder_tokenizer_files(path);
    return source;
  }
  source.model = config_from_checkpoint(path).model;
  source.tensors =
      std::make_unique<io::SafetensorsSet>(io::SafetensorsSet::open(io::resolve_model_file(path)));
  const std::unique_ptr<data::Tokenizer> tokenizer = checkpoint_tokenizer(path);
  source.tokenizer_files = tokenizer->files();
  if (auto config =
          tokenizer_config_for(*tokenizer, source.tokenizer_files, source.model.position_count()))
    source.tokenizer_files.push_back(std::move(*config));
  if (const auto bos = tokenizer->begin_of_sequence()) source.bos_token_id = *bos;
  const std::int32_t eos = tokenizer->document_separator().value_or(tokenizer->end_of_document());
  source.eos_token_id = eos;
  if (source.bos_token_id.is_null() && source.model.arch != model::ArchitectureKind::bert)
    source.bos_token_id = eos;  // GPT-2's convention: one token begins and ends documents
  return source;
}

}  // namespace

DType parse_export_dtype(const std::string& text) {
  std::string valid;
  for (const DTypeWords& d : kExportDTypes) {
    if (text == d.short_name || text == d.torch_name) return d.dtype;
    valid += fmt::format("{}{} ({})", valid.empty() ? "" : ", ", d.short_name, d.torch_name);
  }
  OASES_FAIL("--dtype {} is not a dtype a model folder is written in; valid: {}", text, valid);
}

ExportSummary export_model_folder(const ExportOptions& options) {
  OASES_CHECK(!options.checkpoint.empty(), "--checkpoint is required: the checkpoint to export");
  OASES_CHECK(!options.output.empty(), "--output is required: the folder to write");
  const Source source = open_source(options.checkpoint);
  const model::ModelConfig& m = source.model;
  // Checked before anything is written: the model must have a class to be written as.
  json config = model::hf_config_json(m, "", json(), json(), json());
  const std::string source_name = source.hf_folder ? "model folder" : "checkpoint";

  const model::ParamLayout layout = model::model_param_layout(m);
  std::vector<std::string> stored;  // each parameter's name in the source
  std::map<DType, int> stored_dtypes;
  for (const model::ParamSpec& p : layout.params()) {
    const std::vector<std::string> candidates = source.hf_folder
                                                    ? model::hf_tensor_name_candidates(m, p.name)
                                                    : std::vector<std::string>{p.name};
    std::string found;
    for (const std::string& c : candidates)
      if (found.empty() && source.tensors->has(c)) found = c;
    OASES_CHECK(!found.empty(), "{} '{}' has no tensor '{}' of the model it describes", source_name,
                options.checkpoint, candidates.front());
    OASES_CHECK(source.tensors->info(found).shape == p.full_shape.to_vector(),
                "{} '{}': tensor '{}' has shape {}, the model needs {}", source_name,
                options.checkpoint, found, io::shape_string(source.tensors->info(found).shape),
                io::shape_string(p.full_shape.to_vector()));
    ++stored_dtypes[source.tensors->info(found).dtype];
    stored.push_back(found);
  }
  const DType dtype =
      options.dtype.value_or(stored_dtypes.size() == 1 ? stored_dtypes.begin()->first : DType::f32);
  OASES_CHECK(
      dtype == DType::f32 || dtype == DType::f64 || dtype == DType::bf16 || dtype == DType::f16,
      "the {} '{}' stores its tensors as {}; give --dtype (bf16, fp16, fp32 or fp64)", source_name,
      options.checkpoint, dtype_name(dtype));

  std::error_code ec;
  OASES_CHECK(!fs::exists(options.output, ec) || fs::is_directory(options.output, ec),
              "--output '{}' is a file; give a folder (it is created when missing)",
              options.output);
  fs::create_directories(options.output, ec);
  OASES_CHECK(!ec, "cannot create --output '{}': {}", options.output, ec.message());

  std::vector<io::TensorToWrite> tensors;
  for (const model::ParamSpec& p : layout.params())
    tensors.push_back({model::hf_tensor_name(m, p.name), dtype, p.full_shape.to_vector(), nullptr});
  // Each tensor in the folder's dtype, read shard by shard: the stored bytes when the dtypes
  // agree, so an unchanged folder is copied bit for bit; else converted once from exact
  // doubles, rounded to nearest.
  const auto bytes_of = [&](std::size_t i) {
    const std::string& name = stored[i];
    if (source.tensors->info(name).dtype == dtype) return source.tensors->read_raw(name);
    std::vector<double> values(static_cast<std::size_t>(source.tensors->info(name).numel()));
    source.tensors->read_f64(name, tensors[i].shape, values.data());
    std::vector<std::byte> converted(values.size() * dtype_size(dtype));
    const auto n = static_cast<std::int64_t>(values.size());
    kernels::convert(Tensor::of(values.data(), {n}), Tensor(converted.data(), dtype, Shape{n}));
    return converted;
  };

  ExportSummary summary;
  summary.output = options.output;
  summary.torch_dtype = torch_dtype_name(dtype);
  summary.architecture = config["architectures"][0].get<std::string>();
  summary.tensors = static_cast<std::int64_t>(tensors.size());
  const io::WrittenSafetensorsSet written = io::write_safetensors_set(
      options.output, tensors, options.max_shard_bytes, {{"format", "pt"}}, bytes_of);
  summary.files = written.files;
  summary.tensor_bytes = written.tensor_bytes;

  config = model::hf_config_json(m, summary.torch_dtype, source.bos_token_id, source.eos_token_id,
                                 source.pad_token_id);
  write_json(fs::path(options.output) / model::kHfConfigFile, config);
  summary.files.push_back(model::kHfConfigFile);
  if (m.arch != model::ArchitectureKind::bert) {
    json generation = json::object();
    if (!source.bos_token_id.is_null()) generation["bos_token_id"] = source.bos_token_id;
    if (!source.eos_token_id.is_null()) generation["eos_token_id"] = source.eos_token_id;
    if (!source.pad_token_id.is_null()) generation["pad_token_id"] = source.pad_token_id;
    write_json(fs::path(options.output) / model::kHfGenerationConfigFile, generation);
    summary.files.push_back(model::kHfGenerationConfigFile);
  }
  for (const data::TokenizerFile& file : source.tokenizer_files) {
    AtomicFileWriter out((fs::path(options.output) / file.name).string());
    out.write(file.contents);
    out.commit();
    summary.files.push_back(file.name);
  }
  return summary;
}

}  // namespace oases::train
