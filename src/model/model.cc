#include "model/model.h"

#include "core/error.h"
#include "kernels/kernels.h"
#include "model/bert/bert.h"
#include "model/gpt/gpt.h"
#include "model/llama/llama.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

namespace oases::model {

std::unique_ptr<Architecture> make_architecture(const ModelConfig& config) {
  config.validate();
  if (config.arch == ArchitectureKind::llama) return make_llama(config);
  if (config.arch == ArchitectureKind::bert) return make_bert(config);
  return make_gpt(config);
}

ops::MoeSpec Architecture::moe(const BlockContext&) const {
  OASES_FAIL("this architecture has no mixture-of-experts layers; set model.moe_every = 0");
}

void moe_spec_settings(const ModelConfig& config, ops::MoeSpec& spec) {
  ops::MoeRouterSpec& router = spec.router;
  router.gate = config.moe_gate;
  router.experts = static_cast<int>(config.experts);
  router.top_k = config.moe_gate == ops::MoeGate::expert_choice ? 1 : config.moe_choices();
  router.train_capacity_factor = config.capacity_factor;
  router.eval_capacity_factor = config.moe_eval_capacity_factor();
  router.router_noise = config.moe_router_noise;
  router.aux_coef = config.moe_aux_loss_coef;
  router.z_coef = config.moe_z_loss_coef;
  spec.group_tokens = config.moe_group_tokens();
  spec.expert_dropout = config.expert_dropout;
}

ParamLayout model_param_layout(const ModelConfig& config, int tp_rank, int tp_size,
                               const std::vector<int>& layer_degrees, std::int64_t first_layer,
                               std::int64_t end_layer, int ep_rank, int ep_size) {
  if (end_layer < 0) end_layer = config.layers;
  return model_param_layout(config, tp_rank, tp_size, layer_degrees,
                            {LayerRange{first_layer, end_layer}}, ep_rank, ep_size);
}

ParamLayout model_param_layout(const ModelConfig& config, int tp_rank, int tp_size,
                               const std::vector<int>& layer_degrees,
                               const std::vector<LayerRange>& layer_ranges, int ep_rank,
                               int ep_size) {
  OASES_ASSERT(!layer_ranges.empty(), "a model instance holds at least one chunk");
  OASES_ASSERT(ep_size >= 1 && ep_rank >= 0 && ep_rank < ep_size &&
                   (!config.has_moe() || config.experts % ep_size == 0),
               "expert rank {} of {} for {} experts", ep_rank, ep_size, config.experts);
  const auto architecture = make_architecture(config);
  const auto degree = [&](std::int64_t l) {
    return layer_degrees.empty() ? tp_size : layer_degrees[static_cast<std::size_t>(l)];
  };
  const bool embedding = layer_ranges.front().begin == 0;
  ParamLayout layout(tp_rank, tp_size);
  layout.set_expert_ranks(ep_rank, ep_size);
  if (embedding) {
    layout.begin_group(0);
    architecture->add_embedding_parameters(layout);
  }
  for (const LayerRange& range : layer_ranges) {
    for (std::int64_t l = range.begin; l < range.end; ++l) {
      layout.begin_group(static_cast<int>(1 + l));
      architecture->add_layer_parameters(layout, l, degree(l));
    }
  }
  if (layer_ranges.back().end == config.layers) {
    layout.begin_group(static_cast<int>(config.layers + 1));
    architecture->add_head_parameters(layout, embedding);
  }
  return layout;
}

VocabShard vocab_shard(const ModelConfig& config, int tp_rank, int tp_size) {
  VocabShard shard;
  shard.rows = config.padded_vocab(tp_size) / tp_size;
  shard.begin = tp_rank * shard.rows;
  shard.valid = std::clamp<std::int64_t>(config.vocab_size - shard.begin, 0, shard.rows);
  return shard;
}

namespace {

// Checked before anything is built from them (the layout only asserts).
void check_options(const ModelConfig& config, const ModelOptions& o) {
  OASES_ASSERT(o.tp != nullptr, "a model needs its tensor-parallel group");
  if (o.sequence_parallel) {
    const int T = o.tp->size();
    OASES_CHECK(T > 1,
                "parallel.sequence_parallel = true splits the tokens over the tensor-parallel "
                "group, but parallel.tp = 1; set parallel.tp > 1 or sequence_parallel = false");
    OASES_CHECK(config.seq_len % T == 0,
                "parallel.sequence_parallel = true: model.seq_len = {} must be divisible by "
                "parallel.tp = {}",
                config.seq_len, T);
  }
  OASES_CHECK(o.dtype == DType::f32 || o.dtype == DType::f64,
              "train.precision: the model's parameters are fp32 or fp64, not {}",
              dtype_name(o.dtype));
  if (o.mixed_precision) {
    const DType half = *o.mixed_precision;
    OASES_CHECK((half == DType::bf16 || half == DType::f16) && o.dtype == DType::f32,
                "train.precision: mixed precision computes in bf16 or fp16 over fp32 parameters, "
                "not {} over {}",
                dtype_name(half), dtype_name(o.dtype));
  }
  OASES_CHECK(o.sub_batches >= 1 && o.micro_batch % o.sub_batches == 0,
              "parallel.sub_batches = {} must divide train.micro_batch = {}", o.sub_batches,
              o.micro_batch);
  OASES_ASSERT(o.slot_lanes >= 1, "slot_lanes = {}", o.slot_lanes);
  std::int64_t previous_end = 0;
  for (const LayerRange& range : o.layer_ranges) {
    OASES_ASSERT(
        previous_end <= range.begin && range.begin < range.end && range.end <= config.layers,
        "chunk layers [{}, {}) after layer {} of {}", range.begin, range.end, previous_end,
        config.layers);
    previous_end = range.end;
  }
  const int T = o.tp->size();
  if (const int cp = o.cp ? o.cp->size() : 1; cp > 1) {
    OASES_CHECK(config.seq_len % (2 * cp) == 0,
                "parallel.cp = {}: model.seq_len = {} must be divisible by 2 x cp = {}", cp,
                config.seq_len, 2 * cp);
    OASES_CHECK(o.cp_kind == ops::ContextParallelKind::ring ||
                    (config.heads / T % cp == 0 && config.kv_head_count() / T % cp == 0),
                "parallel.cp_kind = \"all-to-all\": the heads ({}) and kv heads ({}) of each "
                "tensor-parallel rank must be divisible by parallel.cp = {}",
                config.heads / T, config.kv_head_count() / T, cp);
    OASES_CHECK(!config.has_moe(),
                "parallel.cp = {} is not available with mixture-of-experts layers yet", cp);
  }
  if (o.layer_degrees.empty()) return;
  OASES_CHECK(static_cast<std::int64_t>(o.layer_degrees.size()) == config.layers,
              "parallel.plan gives {} layer degrees; the model has model.layers = {}",
              o.layer_degrees.size(), config.layers);
  const std::int64_t rows = o.micro_batch / o.sub_batches;
  for (std::size_t l = 0; l < o.layer_degrees.size(); ++l) {
    const int k = o.layer_degrees[l];
    OASES_CHECK(k >= 1 && T % k == 0,
                "parallel.plan gives layer {} degree {}; valid degrees divide parallel.tp = {}", l,
                k, T);
    OASES_CHECK(rows % (T / k) == 0,
                "parallel.plan gives layer {} degree {}: its {} replicas split every sub-batch "
                "of {} sequences (train.micro_batch / parallel.sub_batches), which they cannot "
                "divide; use a micro-batch whose sub-batches are a multiple of {}",
                l, k, T / k, rows, T / k);
    if (k < T) config.validate_tensor_parallel(k);
  }
}

}  // namespace

// Resolves parameter names to views and records which segments use each parameter group.
class Model::Builder final : public ParamResolver {
 public:
  explicit Builder(Model& model) : m_(model), c_(model.config_), arch_(*model.architecture_) {}

  ops::ParamRef operator()(const std::string& name) const override {
    const ParamSpec& spec = m_.layout_.find(name);
    auto [it, inserted] = first_user_.try_emplace(spec.group, segment_);
    if (!inserted) it->second = std::min(it->second, segment_);
    groups_of_segment_[segment_].insert(spec.group);
    return {m_.layout_.view(m_.compute_params(), spec), m_.layout_.view(m_.grads_, spec)};
  }
  bool has(const std::string& name) const override { return m_.layout_.has(name); }

  void build() {
    ops::ModelContext& ctx = m_.context_;
    allocate_slots();
    if (arch_.rotary()) {
      const std::int64_t half = c_.head_dim() / 2;
      // f32 tables under mixed precision: the angles are not rounded to 16 bits.
      const DType table_dtype = ops::statistics_dtype(ctx.dtype);
      rope_cos_ = m_.arena_.allocate(table_dtype, {c_.seq_len, half});
      rope_sin_ = m_.arena_.allocate(table_dtype, {c_.seq_len, half});
      kernels::rotary_tables(c_.seq_len, c_.rope_inverse_frequencies(), rope_cos_, rope_sin_);
    }
    if (m_.has_embedding()) add_embedding();
    for (const LayerRange& range : m_.options_.layer_ranges) {
      for (std::int64_t l = range.begin; l < range.end; ++l) add_layer(l, range.begin);
      if (range.end == c_.layers)
        add_head();
      else
        add_stage_output(range.end - 1);
    }
    ctx.scratch_narrow = m_.arena_.allocate(ctx.dtype, {ctx.tokens(), c_.hidden});
    ctx.scratch_wide = m_.arena_.allocate(ctx.dtype, {scratch_wide_});
    describe_program();
  }

 private:
  int next_id() const { return static_cast<int>(m_.segments_.size()); }
  void begin_segment() { segment_ = next_id(); }
  const ops::ModelContext& context() const { return m_.context_; }

  // The embedding's and the head's: the whole tensor-parallel group, every row.
  ops::Placement whole_placement() const {
    const ops::ModelContext& ctx = context();
    ops::Placement at;
    at.degree = ctx.tp_size();
    at.shard = ctx.tp_rank();
    at.rows = ctx.rows;
    at.group = ctx.tp;
    return at;
  }
  ops::Placement placement(std::int64_t layer) const {
    const ops::ModelContext& ctx = context();
    const int T = ctx.tp_size();
    ops::Placement at;
    at.degree = m_.layer_degree(layer);
    at.shard = ctx.tp_rank() % at.degree;
    at.rows = ctx.rows * at.degree / T;
    at.first_row = ctx.tp_rank() / at.degree * at.rows;
    at.group = at.degree == T ? ctx.tp : &m_.options_.tp_subgroup(at.degree, 1);
    return at;
  }

  void allocate_slots() {
    bool reshards = false;
    for (const LayerRange& range : m_.options_.layer_ranges) {
      // Layer l - 1 meets layer l inside a chunk, at its start where the chunk holds the
      // embedding, and at its end: before the head, or in the stage output, which hands the next
      // chunk its input in the placement of that chunk's first layer.
      for (std::int64_t l = range.begin; l <= range.end; ++l) {
        const bool joins = l > range.begin || l == 0;
        reshards = reshards || (joins && m_.layer_degree(l - 1) != m_.layer_degree(l));
      }
    }
    OASES_ASSERT(!reshards || m_.options_.tp_subgroup,
                 "per-layer degrees need the tensor-parallel sub-groups");
    ops::ModelContext& ctx = m_.context_;
    std::int64_t moe_rows = 0;
    for (const LayerRange& range : m_.options_.layer_ranges)
      for (std::int64_t l = range.begin; l < range.end; ++l) {
        if (!c_.is_moe_layer(l)) continue;
        ops::MoeSpec moe;
        moe_spec_settings(c_, moe);
        moe_rows = std::max(moe_rows, ops::moe_slot_rows(moe.router, moe.group_tokens,
                                                         placement(l).rows * c_.seq_len));
      }
    // The all-to-alls of context-parallel attention move this rank's q|k|v; the ring moves
    // its k|v and keeps the queries' and the output's gradients.
    const bool ring = ctx.cp_kind == ops::ContextParallelKind::ring;
    const std::int64_t cp_elements =
        ctx.cp_size() == 1 ? 0
        : ring ? ctx.tokens() * std::max(c_.heads, 2 * c_.kv_head_count()) * c_.head_dim() /
                     ctx.tp_size()
               : ctx.tokens() * (c_.heads + 2 * c_.kv_head_count()) * c_.head_dim() / ctx.tp_size();
    ctx.slots.allocate(m_.arena_, ctx.dtype, ctx.slot_lanes, ctx.sub_batches, ctx.tokens(),
                       c_.hidden, reshards, moe_rows, cp_elements, ring && ctx.cp_size() > 1);
  }

  void add_embedding() {
    begin_segment();
    const VocabShard shard = vocab_shard(c_, context().tp_rank(), context().tp_size());
    m_.segments_.push_back(ops::make_embedding_segment(
        next_id(), context(), arch_.embedding(*this, {shard.begin, shard.begin + shard.valid})));
  }

  // The epilogue forming r_layer from the last segment's output: in place, or in a reshard
  // segment where the degree changes (the next segment then copies the reshard's rows).
  ops::ResidualEpilogue epilogue_into(std::int64_t layer) {
    // The residual is the checkpoint of the segment before: under sequence parallelism the
    // shard segment of the layer before's feed-forward block (its body is one segment, or an
    // MoE layer's three).
    const int previous = sequence_parallel() && layer > 0 ? last_shard_id_ : next_id() - 1;
    begin_segment();
    ops::ResidualEpilogue::Spec real = arch_.epilogue_into_layer(layer, previous, *this);
    const int from = m_.layer_degree(layer - 1), to = m_.layer_degree(layer);
    // Under sequence parallelism a rank holds the same tokens at every degree: the shard
    // segment takes them from the rows of the block before (LayerSpec::before).
    if (from == to || sequence_parallel()) return ops::ResidualEpilogue(std::move(real));
    ops::ReshardSpec reshard;
    reshard.name = "reshard." + std::to_string(layer);
    reshard.from = placement(layer - 1);
    reshard.to = placement(layer);
    reshard.gather_group = from < to ? &m_.options_.tp_subgroup(to, from)
                                     : &m_.options_.tp_subgroup(from, to);
    reshard.epilogue = ops::ResidualEpilogue(std::move(real));
    m_.segments_.push_back(ops::make_reshard_segment(next_id(), context(), std::move(reshard)));
    begin_segment();
    ops::ResidualEpilogue::Spec copy;
    copy.copies_input = true;
    return ops::ResidualEpilogue(copy);
  }

  // Layer `layer` of the chunk whose first layer is `chunk_begin`.
  void add_layer(std::int64_t layer, std::int64_t chunk_begin) {
    const ops::Placement at = placement(layer);
    BlockContext block{layer, at, &context(), this, rope_cos_, rope_sin_};
    const bool from_peer = layer == chunk_begin && layer > 0;
    ops::ResidualEpilogue epilogue;
    if (from_peer) {
      begin_segment();
      ops::ResidualEpilogue::Spec copy;
      copy.copies_input = true;
      epilogue = ops::ResidualEpilogue(copy);
    } else {
      epilogue = epilogue_into(layer);
    }
    ops::AttentionSpec attention = arch_.attention(block);
    attention.name = "attention." + std::to_string(layer);
    attention.layer = static_cast<int>(layer);
    attention.at = at;
    attention.epilogue = std::move(epilogue);
    attention.input_from_peer = from_peer;
    if (sequence_parallel())
      split_off_shard(attention, "attention_in.",
                      layer == 0 ? whole_placement() : placement(layer - 1));
    scratch_wide_ =
        std::max(scratch_wide_, ops::scratch_wide_elements(attention, context().seq_len));
    const int attention_id = next_id();
    if (context().cp_size() > 1 && context().cp_kind == ops::ContextParallelKind::ring) {
      scratch_wide_ =
          std::max(scratch_wide_, ops::ring_attention_scratch_elements(context(), attention));
      ops::append_ring_attention_segments(attention_id, context(), std::move(attention),
                                          m_.segments_);
      // The output projection (the last of the layer's attention segments) reads the layer's
      // parameters the projections resolved.
      groups_of_segment_[next_id() - 1] = groups_of_segment_[attention_id];
    } else if (context().cp_size() > 1) {
      ops::append_all_to_all_attention_segments(attention_id, context(), std::move(attention),
                                                m_.segments_);
      // The output projection reads the layer's parameters the projections resolved.
      groups_of_segment_[attention_id + 2] = groups_of_segment_[attention_id];
    } else {
      m_.segments_.push_back(
          ops::make_attention_segment(attention_id, context(), std::move(attention)));
    }
    // The segment whose checkpoint holds r_layer, the residual of the MLP's epilogue.
    const int residual_id = sequence_parallel() ? attention_id - 1 : attention_id;

    begin_segment();
    if (c_.is_moe_layer(layer)) return add_moe(block, residual_id);
    ops::MlpSpec mlp = arch_.mlp(block);
    mlp.name = "mlp." + std::to_string(layer);
    mlp.layer = static_cast<int>(layer);
    mlp.at = at;
    mlp.epilogue = ops::ResidualEpilogue(arch_.epilogue_into_mlp(layer, residual_id, *this));
    if (sequence_parallel()) split_off_shard(mlp, "mlp_in.", at);
    scratch_wide_ = std::max(scratch_wide_, ops::scratch_wide_elements(mlp, context().seq_len));
    m_.segments_.push_back(ops::make_mlp_segment(next_id(), context(), std::move(mlp)));
  }

  bool sequence_parallel() const { return m_.options_.sequence_parallel; }

  // Sequence parallelism: appends the shard segment that runs `block`'s epilogue and pre-norm
  // on this rank's tokens ("<prefix><layer>"), and leaves `block` the body that starts from the
  // gathered tokens. Both read the parameters resolved for the segment begun last; the shard
  // segment, first of the two, finishes the bucket.
  void split_off_shard(ops::LayerSpec& block, const std::string& prefix,
                       const ops::Placement& before) {
    ops::LayerSpec shard;
    shard.before = before;
    shard.name = prefix + std::to_string(block.layer);
    shard.layer = block.layer;
    shard.at = block.at;
    shard.epilogue = block.epilogue;
    shard.input_from_peer = block.input_from_peer;
    shard.pre_norm = block.pre_norm;
    add_shard_segment(std::move(shard));
    ops::ResidualEpilogue::Spec copy;
    copy.copies_input = true;
    block.epilogue = ops::ResidualEpilogue(copy);
    block.pre_norm = ops::Norm();
    block.input_from_peer = false;
    block.sequence_parallel = true;
  }
  // Parameters a segment applies to this rank's tokens alone (sequence parallelism): their
  // gradients are partial sums. Each is summed over the group of the layer it belongs to, the
  // ranks that share its rows (the epilogue's to the block before, the norm's to this one), so
  // that the bucket's own reduction over the layer's replicas completes it.
  void record_shard_gradients(comm::Communicator* epilogue_group,
                              const ops::ResidualEpilogue& epilogue, comm::Communicator* norm_group,
                              const ops::Norm& norm) {
    const auto partial = [&](comm::Communicator* group, const ops::ParamRef& param) {
      if (!param.present() || param.grad.empty()) return;
      const std::int64_t begin = (static_cast<const std::byte*>(param.grad.raw()) -
                                  static_cast<const std::byte*>(m_.grads_.raw())) /
                                 static_cast<std::int64_t>(dtype_size(m_.grads_.dtype()));
      shard_gradients_.push_back({group, {begin, begin + param.grad.numel()}});
    };
    partial(norm_group, norm.weight());
    partial(norm_group, norm.bias());
    partial(epilogue_group, epilogue.spec().bias);
    partial(epilogue_group, epilogue.spec().post_norm.weight());
    partial(epilogue_group, epilogue.spec().post_norm.bias());
  }
  void add_shard_segment(ops::LayerSpec shard) {
    const int id = next_id();
    const ops::Placement& before = shard.before.group != nullptr ? shard.before : shard.at;
    record_shard_gradients(before.group, shard.epilogue, shard.at.group, shard.pre_norm);
    m_.segments_.push_back(ops::make_sequence_shard_segment(id, context(), std::move(shard)));
    groups_of_segment_[id + 1] = groups_of_segment_[id];
    segment_ = id + 1;
    last_shard_id_ = id;
  }

  // `residual_id`: the segment whose checkpoint holds r_layer (the attention, or under
  // sequence parallelism its shard segment).
  void add_moe(const BlockContext& block, int residual_id) {
    const std::int64_t layer = block.layer;
    ops::MoeSpec moe = arch_.moe(block);
    moe_spec_settings(c_, moe);
    moe.name = "moe_dispatch." + std::to_string(layer);
    moe.layer = static_cast<int>(layer);
    moe.at = block.at;
    moe.epilogue = ops::ResidualEpilogue(arch_.epilogue_into_mlp(layer, residual_id, *this));
    // Under sequence parallelism the dispatch routes the gathered tokens of its group, as it
    // routes the replicated ones without it; the combine reduce-scatters them back.
    if (sequence_parallel()) split_off_shard(moe, "mlp_in.", block.at);
    moe.stats = &m_.moe_stats_[static_cast<std::size_t>(layer)];
    moe.expert_ranks = context().ep->size();
    scratch_wide_ = std::max(scratch_wide_, ops::scratch_wide_elements(moe, c_.seq_len));
    const int dispatch = next_id();
    ops::append_moe_segments(dispatch, context(), moe, m_.segments_);
    // The experts read the layer's parameters the dispatch resolved.
    groups_of_segment_[dispatch + 1] = groups_of_segment_[dispatch];
  }

  void add_head() {
    ops::ResidualEpilogue epilogue = epilogue_into(c_.layers);
    ops::HeadSpec head = arch_.head(*this);
    if (sequence_parallel()) {
      // r_L is formed on the shard and gathered; the head computes from the whole.
      ops::LayerSpec shard;
      shard.name = "head_in";
      shard.layer = -1;
      shard.at = whole_placement();
      shard.before = placement(c_.layers - 1);
      shard.epilogue = std::move(epilogue);
      shard.feeds_head = true;
      add_shard_segment(std::move(shard));
      ops::ResidualEpilogue::Spec copy;
      copy.copies_input = true;
      epilogue = ops::ResidualEpilogue(copy);
      head.gathered_input = true;
    }
    head.epilogue = std::move(epilogue);
    const VocabShard shard = vocab_shard(c_, context().tp_rank(), context().tp_size());
    head.vocab_begin = shard.begin;
    head.vocab_valid = shard.valid;
    scratch_wide_ = std::max(scratch_wide_, ops::head_scratch_wide_elements(context()));
    const int head_id = next_id();
    ops::append_head_segments(head_id, context(), std::move(head), m_.loss_, m_.arena_,
                              m_.segments_);
    // Under tensor parallelism the loss segment's backward multiplies by the head's vocabulary
    // weight: the segments after the head read what the head reads.
    for (int id = head_id + 1; id < next_id(); ++id)
      groups_of_segment_[id] = groups_of_segment_[head_id];
  }

  // Ends the chunk whose last layer is `last`. The chunk sends r_{last + 1} in the placement of
  // the next chunk's first layer, resharding first where the degree changes at the cut, so that
  // each rank's message is exactly the rows its peer (same tensor-parallel rank) receives.
  void add_stage_output(std::int64_t last) {
    const std::int64_t next = last + 1;
    ops::ResidualEpilogue epilogue = epilogue_into(next);
    ops::StageOutputSpec output;
    output.name = "stage_output";
    // Under sequence parallelism the block sent is this rank's tokens, the same at any degree:
    // formed in the rows of the stage's last layer, whose group gathers its gradient back.
    output.at = sequence_parallel() ? placement(last) : placement(next);
    output.epilogue = std::move(epilogue);
    output.sequence_parallel = sequence_parallel();
    if (sequence_parallel())
      record_shard_gradients(output.at.group, output.epilogue, output.at.group, ops::Norm());
    m_.segments_.push_back(ops::make_stage_output_segment(next_id(), context(), std::move(output)));
  }

  // Shapes in order; each group's bucket is final after the backward pass of the first
  // segment that uses it (segments run backward in reverse order).
  void describe_program() {
    std::map<int, int> ready;  // segment -> group
    for (const auto& [group, segment] : first_user_) {
      OASES_ASSERT(!ready.contains(segment), "segment {} would finish groups {} and {}", segment,
                   ready[segment], group);
      ready[segment] = group;
    }
    for (const auto& [group, range] : m_.layout_.groups()) {
      OASES_ASSERT(first_user_.contains(group), "parameter group {} is used by no segment", group);
      const bool experts = group >= expert_group_of(c_.layers, 0);
      const int layer = experts                            ? group - expert_group_of(c_.layers, 0)
                        : group >= 1 && group <= c_.layers ? group - 1
                                                           : -1;
      m_.buckets_.push_back({group, range.first, range.second, layer, experts});
    }
    // In memory order (an MoE layer's expert group follows its layer's group).
    std::sort(m_.buckets_.begin(), m_.buckets_.end(),
              [](const Bucket& a, const Bucket& b) { return a.begin < b.begin; });
    for (const ShardGradient& g : shard_gradients_) {
      const auto bucket = std::find_if(
          m_.buckets_.begin(), m_.buckets_.end(),
          [&](const Bucket& b) { return b.begin <= g.range.first && g.range.second <= b.end; });
      OASES_ASSERT(bucket != m_.buckets_.end(), "gradient range [{}, {}) in no bucket",
                   g.range.first, g.range.second);
      auto& all = m_.token_shard_gradients_;
      auto entry = std::find_if(all.begin(), all.end(), [&](const TokenShardGradients& t) {
        return t.bucket == bucket->id && t.group == g.group;
      });
      if (entry == all.end()) entry = all.insert(all.end(), {bucket->id, g.group, {}});
      entry->ranges.push_back(g.range);
    }
    for (int i = 0; i < next_id(); ++i) {
      ops::SegmentShape shape = m_.segments_[static_cast<std::size_t>(i)]->shape();
      if (auto it = ready.find(i); it != ready.end()) shape.ready_bucket = it->second;
      if (auto it = groups_of_segment_.find(i); it != groups_of_segment_.end())
        shape.param_buckets.assign(it->second.begin(), it->second.end());
      m_.program_.segments.push_back(std::move(shape));
    }
    m_.program_.set_element_bytes = dtype_size(m_.context_.dtype);
    const std::size_t param_element = dtype_size(m_.compute_params().dtype());
    for (const Bucket& b : m_.buckets_) {
      auto& bytes = m_.program_.bucket_param_bytes;
      auto& experts = m_.program_.bucket_holds_experts;
      if (bytes.size() <= static_cast<std::size_t>(b.id)) {
        bytes.resize(b.id + 1, 0);
        experts.resize(b.id + 1, false);
      }
      bytes[static_cast<std::size_t>(b.id)] = static_cast<std::size_t>(b.end - b.begin) * param_element;
      experts[static_cast<std::size_t>(b.id)] = b.experts;
    }
  }

  Model& m_;
  const ModelConfig& c_;
  const Architecture& arch_;
  int segment_ = 0;  // the segment whose parameters are being resolved
  int last_shard_id_ = -1;                 // sequence parallelism: the last shard segment added
  mutable std::map<int, int> first_user_;  // group -> first segment using it
  mutable std::map<int, std::set<int>> groups_of_segment_;  // segment -> groups it reads
  std::int64_t scratch_wide_ = 1;
  Tensor rope_cos_, rope_sin_;
  // Gradients a shard segment forms from this rank's tokens alone, and the group that sums them.
  struct ShardGradient {
    comm::Communicator* group = nullptr;
    std::pair<std::int64_t, std::int64_t> range;
  };
  std::vector<ShardGradient> shard_gradients_;
};

Model::Model(const ModelConfig& config, ModelOptions options)
    : config_(config), options_(std::move(options)), store_(Device::cpu()) {
  config_.validate();
  OASES_ASSERT(options_.tp != nullptr, "a model needs its tensor-parallel group");
  config_.validate_tensor_parallel(options_.tp->size());
  if (options_.end_layer < 0) options_.end_layer = config_.layers;
  if (options_.layer_ranges.empty())
    options_.layer_ranges.push_back({options_.first_layer, options_.end_layer});
  options_.first_layer = options_.layer_ranges.front().begin;
  options_.end_layer = options_.layer_ranges.back().end;
  check_options(config_, options_);
  architecture_ = make_architecture(config_);

  comm::Communicator& ep = options_.ep ? *options_.ep : self_ep_;
  layout_ = model_param_layout(config_, options_.tp->rank(), options_.tp->size(),
                               options_.layer_degrees, options_.layer_ranges, ep.rank(), ep.size());
  const auto bytes = static_cast<std::size_t>(layout_.total_numel()) * dtype_size(options_.dtype);
  if (options_.allocate_params) {
    param_buffer_ = options_.allocate_params(bytes);
    params_ = param_buffer_.tensor(options_.dtype, {layout_.total_numel()});
  } else if (options_.pageable_params) {
    pageable_param_buffer_ = PageableBuffer(bytes);
    params_ = pageable_param_buffer_.tensor(options_.dtype, {layout_.total_numel()});
  } else {
    param_buffer_ = Buffer(bytes);
    params_ = param_buffer_.tensor(options_.dtype, {layout_.total_numel()});
  }
  if (options_.pageable_grads) {
    pageable_grad_buffer_ = PageableBuffer(bytes);
    grads_ = pageable_grad_buffer_.tensor(options_.dtype, {layout_.total_numel()});
  } else {
    grad_buffer_ = Buffer(bytes);
    grads_ = grad_buffer_.tensor(options_.dtype, {layout_.total_numel()});
  }
  if (options_.mixed_precision) {
    const DType half = *options_.mixed_precision;
    const auto half_bytes = static_cast<std::size_t>(layout_.total_numel()) * dtype_size(half);
    if (options_.pageable_params) {
      pageable_compute_param_buffer_ = PageableBuffer(half_bytes);
      compute_params_ = pageable_compute_param_buffer_.tensor(half, {layout_.total_numel()});
    } else {
      compute_param_buffer_ = Buffer(half_bytes);
      compute_params_ = compute_param_buffer_.tensor(half, {layout_.total_numel()});
    }
  }

  context_.dtype = options_.mixed_precision.value_or(options_.dtype);
  context_.gemm16 = options_.gemm16;
  // The model's own workspace for its 16-bit products (primitives and scratch kept between
  // calls), unless the caller shares one.
  if (!context_.gemm16.workspace) context_.gemm16.workspace = kernels::make_gemm16_workspace();
  context_.cp = options_.cp ? options_.cp : &self_cp_;
  context_.cp_kind = options_.cp_kind;
  context_.full_seq_len = config_.seq_len;
  context_.seq_len = config_.seq_len / context_.cp_size();
  context_.hidden = config_.hidden;
  context_.rows = options_.micro_batch / options_.sub_batches;
  context_.sub_batches = options_.sub_batches;
  context_.slot_lanes = options_.slot_lanes;
  context_.tp = options_.tp;
  context_.ep = options_.ep ? options_.ep : &self_ep_;
  context_.seed = options_.seed;
  context_.sequence_parallel = options_.sequence_parallel;
  context_.dropout = config_.dropout;
  context_.attention_dropout = config_.attention_dropout;
  context_.store = &store_;
  moe_stats_.resize(static_cast<std::size_t>(config_.layers));
  reset_moe_stats();
  Builder(*this).build();
  if (!options_.shape_only) initialize(options_.seed);
}

int Model::layer_degree(std::int64_t layer) const {
  const int T = options_.tp->size();
  if (layer < 0 || layer >= config_.layers || options_.layer_degrees.empty()) return T;
  return options_.layer_degrees[static_cast<std::size_t>(layer)];
}

const Model::Bucket& Model::bucket(int id) const {
  for (const Bucket& b : buckets_)
    if (b.id == id) return b;
  OASES_ASSERT(false, "no gradient bucket {}", id);
  __builtin_unreachable();
}

void Model::reset_moe_stats() {
  for (std::int64_t l = 0; l < config_.layers; ++l)
    if (config_.is_moe_layer(l)) moe_stats_[static_cast<std::size_t>(l)].reset(static_cast<int>(config_.experts));
}

void Model::zero_grads() {
  if (options_.pageable_grads) {
    pageable_grad_buffer_.zero_resident();
  } else {
    kernels::zero(grads_);
  }
}

void Model::release_grads(std::int64_t begin, std::int64_t end) {
  OASES_ASSERT(0 <= begin && begin <= end && end <= grads_.numel(),
               "release of gradients [{}, {}) of {}", begin, end, grads_.numel());
  if (!options_.pageable_grads) {
    kernels::zero(grads_.view(begin, {end - begin}));
    return;
  }
  const std::size_t element = dtype_size(options_.dtype);
  pageable_grad_buffer_.release(static_cast<std::size_t>(begin) * element,
                                static_cast<std::size_t>(end - begin) * element);
}

std::size_t Model::resident_grad_bytes() const {
  return options_.pageable_grads ? pageable_grad_buffer_.resident_bytes() : grads_.nbytes();
}

void Model::initialize(std::uint64_t seed) {
  initialize_parameters(layout_, config_.layers, seed, params_);
  refresh_compute_params();
}

void Model::refresh_compute_params() {
  if (mixed_precision()) kernels::convert(params_, compute_params_);
}

void Model::refresh_compute_params(std::int64_t begin, std::int64_t end) {
  OASES_ASSERT(0 <= begin && begin <= end && end <= params_.numel(),
               "refresh of parameters [{}, {}) of {}", begin, end, params_.numel());
  if (mixed_precision() && begin < end)
    kernels::convert(params_.view(begin, {end - begin}), compute_params_.view(begin, {end - begin}));
}

void Model::release_compute_params(std::int64_t begin, std::int64_t end) {
  OASES_ASSERT(options_.pageable_params && 0 <= begin && begin <= end && end <= params_.numel(),
               "release of parameters [{}, {}) of {} (pageable: {})", begin, end,
               params_.numel(), options_.pageable_params);
  const Tensor& copy = compute_params();
  const std::size_t element = dtype_size(copy.dtype());
  PageableBuffer& pages =
      mixed_precision() ? pageable_compute_param_buffer_ : pageable_param_buffer_;
  if (pages.data() == nullptr) return;  // the master placed by allocate_params
  pages.release(static_cast<std::size_t>(begin) * element,
                static_cast<std::size_t>(end - begin) * element);
}

void Model::release_master_params(std::int64_t begin, std::int64_t end) {
  OASES_ASSERT(options_.pageable_params && mixed_precision() && 0 <= begin && begin <= end &&
                   end <= params_.numel(),
               "release of master parameters [{}, {}) of {}", begin, end, params_.numel());
  if (pageable_param_buffer_.data() == nullptr) return;
  const std::size_t element = dtype_size(options_.dtype);
  pageable_param_buffer_.release(static_cast<std::size_t>(begin) * element,
                                 static_cast<std::size_t>(end - begin) * element);
}

std::size_t Model::resident_param_bytes() const {
  const auto resident = [](const PageableBuffer& pages, const Tensor& whole) {
    return pages.data() != nullptr ? pages.resident_bytes() : whole.nbytes();
  };
  std::size_t bytes = resident(pageable_param_buffer_, params_);
  if (mixed_precision()) bytes += resident(pageable_compute_param_buffer_, compute_params_);
  return bytes;
}

}  // namespace oases::model
