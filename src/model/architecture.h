// Architecture: what distinguishes GPT, LLaMA and BERT, as data for the model builder
// (model/model.h). An architecture names its parameters (with their Hugging Face names,
// shapes, shardings and initialisation) and describes each segment as an ops spec built from
// ops/ building blocks; the builder owns everything they share: placements, reshards between
// layers of different degrees, pipeline-stage boundaries, slots, scratch and buckets.
#pragma once

#include "model/config.h"
#include "model/param_layout.h"
#include "ops/boundary_segments.h"
#include "ops/context.h"
#include "ops/embedding_segment.h"
#include "ops/epilogue.h"
#include "ops/head_segments.h"
#include "ops/layer_segments.h"

#include <functional>
#include <memory>
#include <string>

namespace oases::model {

// Parameter views by name, resolved once while the segments are built. A name the layout does
// not hold resolves to an absent ParamRef only where `optional` says so. A resolver for
// inference only (model/incremental_decoder.h) gives ParamRefs with empty gradients.
class ParamResolver {
 public:
  virtual ~ParamResolver() = default;
  virtual ops::ParamRef operator()(const std::string& name) const = 0;
  virtual bool has(const std::string& name) const = 0;
  ops::ParamRef optional(const std::string& name) const {
    return has(name) ? (*this)(name) : ops::ParamRef{};
  }
};

// Where a block is built: its layer, placement, the shared context and the rotary tables.
struct BlockContext {
  std::int64_t layer = 0;
  ops::Placement at;
  const ops::ModelContext* model = nullptr;
  const ParamResolver* params = nullptr;
  Tensor rope_cos, rope_sin;  // [seq, head_dim / 2] where the architecture rotates
};

class Architecture {
 public:
  virtual ~Architecture() = default;

  // Parameters of the embedding group, of layer `layer` at tensor-parallel `degree`, and of
  // the head group (`with_embedding`: the word embedding is in this model instance already;
  // a tied head on a stage without it adds its own copy).
  virtual void add_embedding_parameters(ParamLayout& layout) const = 0;
  virtual void add_layer_parameters(ParamLayout& layout, std::int64_t layer, int degree) const = 0;
  virtual void add_head_parameters(ParamLayout& layout, bool with_embedding) const = 0;

  virtual bool rotary() const { return false; }

  virtual ops::EmbeddingSpec embedding(const ParamResolver& params,
                                       kernels::VocabRange vocab) const = 0;
  // The epilogue that forms r_layer (layer = layers: the head's input) from the output of
  // segment `previous` (whose checkpoint is the residual, where there is one).
  virtual ops::ResidualEpilogue::Spec epilogue_into_layer(std::int64_t layer, int previous,
                                                          const ParamResolver& params) const = 0;
  // The epilogue that forms h_layer from the attention segment `attention`'s output.
  virtual ops::ResidualEpilogue::Spec epilogue_into_mlp(std::int64_t layer, int attention,
                                                        const ParamResolver& params) const = 0;
  // The layer's blocks; the builder fills in name, layer, placement and epilogue.
  virtual ops::AttentionSpec attention(const BlockContext& at) const = 0;
  virtual ops::MlpSpec mlp(const BlockContext& at) const = 0;
  // An MoE layer's feed-forward block (ModelConfig::is_moe_layer): its pre-norm, router and
  // experts; the builder fills in the rest (moe_spec_settings).
  virtual ops::MoeSpec moe(const BlockContext& at) const;
  // The head; the builder fills in the epilogue and the vocabulary range.
  virtual ops::HeadSpec head(const ParamResolver& params) const = 0;

  // The HF name of the word embedding the embedding segment reads (for the vocab range).
  virtual std::string word_embedding_name() const = 0;
};

// The routing settings, group size and expert dropout of config's MoE layers.
void moe_spec_settings(const ModelConfig& config, ops::MoeSpec& spec);

// The architecture of `config.arch` (validated).
std::unique_ptr<Architecture> make_architecture(const ModelConfig& config);

}  // namespace oases::model
