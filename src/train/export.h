// `oases export`: a checkpoint written as a Hugging Face model folder that `from_pretrained`
// loads (docs/fine-tuning.md).
//
// The folder holds
//   config.json             the architecture's class and keys (model/hf_config.h), torch_dtype
//   generation_config.json  the token ids generation starts and stops at (GPT-2 and LLaMA;
//                           BertForMaskedLM does not generate and gets none)
//   model.safetensors       every parameter under its Hugging Face name, or, above the shard
//     or model-0000k-of-0000n.safetensors + model.safetensors.index.json
//                           size, shards and their index (io/safetensors_set.h)
//   the tokenizer's files   those the run used, under their Hugging Face names, with a
//                           tokenizer_config.json naming the transformers class that reads
//                           them when they carry none
// A tied LM head is not written (transformers ties it on loading). Checkpoints hold whole
// tensors whatever the layout that wrote them, so a folder is the same for every layout.
//
// The source is a checkpoint (a step_N folder, a run's checkpoint.dir, a model.safetensors
// file) or a Hugging Face model folder itself: exported with its own dtype, a folder's tensors
// are copied bit for bit, and its config and token ids are kept.
#pragma once

#include "core/dtype.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oases::train {

struct ExportOptions {
  std::string checkpoint;  // --checkpoint
  std::string output;  // --output: the folder to write (created; files of the same names replaced)
  // --dtype: f32, bf16, f16 or f64; unset: the dtype the source stores (float32 when its
  // tensors differ).
  std::optional<DType> dtype;
  std::uint64_t max_shard_bytes = 5'000'000'000;  // --shard-size (5GB, as save_pretrained)
};

struct ExportSummary {
  std::string output;
  std::string architecture;        // "LlamaForCausalLM", ...
  std::string torch_dtype;         // "bfloat16", ...
  std::vector<std::string> files;  // written, in order
  std::int64_t tensors = 0;
  std::uint64_t tensor_bytes = 0;
};

// Writes the folder. UserError for a source that is none of the above, a model no Hugging
// Face class holds (mixture of experts), an output that is a file, or a dtype other than the
// four.
ExportSummary export_model_folder(const ExportOptions& options);

// The DType --dtype names ("bf16", "fp16", "fp32", "fp64"; also torch's "bfloat16",
// "float16", "float32", "float64"); UserError naming --dtype and the valid words otherwise.
DType parse_export_dtype(const std::string& text);

}  // namespace oases::train
