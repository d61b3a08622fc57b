// ParamLayout: every parameter of a model (this rank's shards) as a named view into one flat
// array of the model's element type. The same offsets index the gradient array and the
// optimizer's state, so optimizer steps, gradient clipping, bucketing and checkpointing all
// work on offsets into flat buffers.
//
// Names and whole shapes are those of the architecture's Hugging Face checkpoints (GPT-2's
// Conv1D weights [in, out]; LLaMA's and BERT's torch.nn.Linear weights [out, in]), so
// checkpoints load in PyTorch as they are.
//
// Parameters come in groups, each contiguous: the embedding group (id 0), one group per
// transformer layer l (id 1 + l), the head group (id layers + 1), and for an MoE layer l the
// group of this rank's experts (id expert_group_of(layers, l), added right after layer l's
// group: its gradients are summed over other ranks than the rest of the layer's). Each group is
// one gradient bucket.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace oases::model {

enum class ParamInit {
  normal,           // N(0, 0.02)
  normal_residual,  // N(0, 0.02 / sqrt(2 * layers)): GPT-2's projections into the residual stream
  zeros,
  ones,
};

// How a parameter is split across the ranks of a tensor-parallel group (Megatron-LM's scheme).
enum class Sharding {
  replicated,   // every rank holds the whole tensor (norms, positions, row-parallel biases)
  rows,         // dim 0 split in equal contiguous blocks (vocabularies, padded to a multiple of
                // the group size with zero rows; [out, in] column-parallel weights and their
                // biases; [in, out] row-parallel weights)
  columns,      // last dim split in equal contiguous blocks ([in, out] column-parallel weights
                // and biases; [out, in] row-parallel weights)
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
  int group = 0;         // the parameter group (gradient bucket) it belongs to
  // Multiplies the standard deviation of a normal initialisation (MoE experts and routers:
  // sqrt(model.moe_init_scale)).
  double init_std_scale = 1;
  std::int64_t numel() const { return shape.numel(); }
};

// The parameter group of MoE layer `layer`'s experts in a model of `layers` layers.
inline int expert_group_of(std::int64_t layers, std::int64_t layer) {
  return static_cast<int>(layers + 2 + layer);
}

class ParamLayout {
 public:
  ParamLayout(int tp_rank = 0, int tp_size = 1) : tp_rank_(tp_rank), tp_size_(tp_size) {}

  // Parameters added from now on belong to `group` (a group's parameters must be added without
  // another group's between them).
  void begin_group(int group);

  // Expert parallelism: this rank is rank `rank` of `size` that split every MoE layer's experts
  // (it holds experts [rank x E / size, (rank + 1) x E / size)).
  void set_expert_ranks(int rank, int size) {
    ep_rank_ = rank;
    ep_size_ = size;
  }
  int ep_rank() const { return ep_rank_; }
  int ep_size() const { return ep_size_; }

  // Adds a parameter whose whole shape is `full_shape`; its shard shape follows `sharding`,
  // split `degree` ways (0: the group size; it must divide the group size). For
  // Sharding::rows, `padded_rows` (>= full rows, a multiple of the degree) is the padded
  // extent of dim 0; 0 means no padding.
  void add(std::string name, Shape full_shape, ParamInit init,
           Sharding sharding = Sharding::replicated, std::int64_t padded_rows = 0, int degree = 0);
  // Sets init_std_scale of the parameter added last.
  void scale_last_init(double std_scale);

  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }

  // Flat index into the whole tensor of element `local_index` of this rank's shard, or -1
  // for a padding element that the whole tensor does not have.
  std::int64_t global_index(const ParamSpec& spec, std::int64_t local_index) const;

  const std::vector<ParamSpec>& params() const { return params_; }
  std::int64_t total_numel() const { return total_; }
  bool has(const std::string& name) const { return index_.contains(name); }
  const ParamSpec& find(const std::string& name) const;  // InternalError if absent

  // Element ranges [begin, end) of the groups present, by group id.
  const std::map<int, std::pair<std::int64_t, std::int64_t>>& groups() const { return groups_; }

  // The view of parameter `name` inside a flat array laid out by this layout.
  Tensor view(const Tensor& flat, const std::string& name) const;
  Tensor view(const Tensor& flat, const ParamSpec& spec) const;

 private:
  int tp_rank_;
  int tp_size_;
  int ep_rank_ = 0, ep_size_ = 1;
  int group_ = 0;
  std::vector<ParamSpec> params_;
  std::map<std::string, std::size_t> index_;
  std::map<int, std::pair<std::int64_t, std::int64_t>> groups_;
  std::int64_t total_ = 0;
};

// Fills `flat` with the initial parameters. Element i of the whole parameter p is drawn from
// Philox keyed by (seed, name of p) at counter i; a shard draws only its own elements, so the
// values do not depend on the tensor-parallel layout. Padding elements are zero. `layers`
// scales ParamInit::normal_residual.
void initialize_parameters(const ParamLayout& layout, std::int64_t layers, std::uint64_t seed,
                           const Tensor& flat);

}  // namespace oases::model
