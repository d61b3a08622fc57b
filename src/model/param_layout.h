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

struct ParamSpec {
  std::string name;      // e.g. "h.3.attn.c_attn.weight"
  Shape shape;
  std::int64_t offset;   // element offset into the flat array
  ParamInit init;
  bool weight_decay;     // true for matrices (>= 2 dims), false for biases and norm weights
  std::int64_t numel() const { return shape.numel(); }
};

class ParamLayout {
 public:
  void add(std::string name, Shape shape, ParamInit init);

  const std::vector<ParamSpec>& params() const { return params_; }
  std::int64_t total_numel() const { return total_; }
  const ParamSpec& find(const std::string& name) const;  // InternalError if absent

  // The view of parameter `name` inside a flat array laid out by this layout.
  Tensor view(float* flat, const std::string& name) const;

 private:
  std::vector<ParamSpec> params_;
  std::int64_t total_ = 0;
};

ParamLayout gpt_param_layout(const GptConfig& config);

// Fills `flat` with the initial parameters. Element i of parameter p is drawn from Philox keyed
// by (seed, name of p) at counter i, so the value is independent of any sharding of p.
void initialize_parameters(const ParamLayout& layout, const GptConfig& config,
                           std::uint64_t seed, float* flat);

}  // namespace oases::model
