// ParamLayout: every parameter of a model as a named view into one flat fp32 array. The same
// offsets index the gradient array and the optimizer's moment arrays, so optimizer steps,
// gradient clipping, bucketing and checkpointing all work on offsets into flat buffers.
//
// Names and shapes follow the Hugging Face GPT-2 checkpoint layout (linear weights stored
// [in, out], "Conv1D"), so checkpoints are loadable by PyTorch users as they are.
#pragma once

#include "core/tensor.h"
#include "model/gpt_config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oases::model {

enum class ParamInit {
  normal,           // N(0, 0.02)
  normal_residual,  // N(0, 0.02 / sqrt(2 * layers)): projections into the residual stream
  zeros,
  ones,
};

// How a parameter is split across the ranks of a tensor-parallel group (Megatron-LM's scheme).
enum class Sharding {
  replicated,   // every rank holds the whole tensor (LayerNorms, wpe, row-parallel biases)
  rows,         // dim 0 split in equal contiguous blocks (row-parallel weights; wte by vocab,
                // padded to a multiple of the group size with zero rows)
  columns,      // last dim split in equal contiguous blocks (column-parallel weight / bias)
  qkv_columns,  // last dim is [q | k | v]; each of the three is split by heads, and a rank
                // holds [q_r | k_r | v_r] (so its heads are complete)
};

struct ParamSpec {
  std::string name;      // e.g. "h.3.attn.c_attn.weight"
  Shape shape;           // this rank's shard
  Shape full_shape;      // the whole tensor, as stored in checkpoints
  Sharding sharding;
  std::int64_t offset;   // element offset into the flat array
  ParamInit init;
  bool weight_decay;     // true for matrices (>= 2 dims), false for biases and norm weights
  // The parameter is split into `parts` shards and this rank holds shard `part` (1 and 0 when
  // replicated). A layer run at degree k < the group size T has k parts: ranks r with the same
  // r % k hold the same shard (T / k replicas).
  int parts = 1;
  int part = 0;
  std::int64_t numel() const { return shape.numel(); }
};

class ParamLayout {
 public:
  ParamLayout(int tp_rank = 0, int tp_size = 1) : tp_rank_(tp_rank), tp_size_(tp_size) {}

  // Adds a parameter whose whole shape is `full_shape`; its shard shape follows `sharding`,
  // split `degree` ways (0: the group size; it must divide the group size). For
  // Sharding::rows, `padded_rows` (>= full rows, a multiple of the degree) is the padded
  // extent of dim 0; 0 means no padding.
  void add(std::string name, Shape full_shape, ParamInit init,
           Sharding sharding = Sharding::replicated, std::int64_t padded_rows = 0, int degree = 0);

  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }

  // Flat index into the whole tensor of element `local_index` of this rank's shard, or -1
  // for a padding element that the whole tensor does not have.
  std::int64_t global_index(const ParamSpec& spec, std::int64_t local_index) const;

  const std::vector<ParamSpec>& params() const { return params_; }
  std::int64_t total_numel() const { return total_; }
  const ParamSpec& find(const std::string& name) const;  // InternalError if absent

  // The view of parameter `name` inside a flat array laid out by this layout.
  Tensor view(float* flat, const std::string& name) const;

 private:
  int tp_rank_;
  int tp_size_;
  std::vector<ParamSpec> params_;
  std::int64_t total_ = 0;
};

// The parameters of a GPT held by rank `tp_rank` of a tensor-parallel group of `tp_size`.
// `layer_degrees` (one per layer, each dividing tp_size; empty: all tp_size) splits layer l's
// parameters over layer_degrees[l] ranks; the embeddings and ln_f stay at tp_size.
ParamLayout gpt_param_layout(const GptConfig& config, int tp_rank = 0, int tp_size = 1,
                             const std::vector<int>& layer_degrees = {});

// Fills `flat` with the initial parameters. Element i of the whole parameter p is drawn from
// Philox keyed by (seed, name of p) at counter i; a shard draws only its own elements, so the
// values do not depend on the tensor-parallel layout. Padding elements are zero.
void initialize_parameters(const ParamLayout& layout, const GptConfig& config,
                           std::uint64_t seed, float* flat);

}  // namespace oases::model
