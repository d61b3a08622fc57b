// RunConfig::validate: each setting's range, then the combinations that cannot run together,
// section by section. Every message names the setting, the value found and what is valid.
#include "plan/run_config.h"

#include "core/error.h"
#include "plan/resolve.h"
#include "plan/settings.h"
#include "schedule/pipeline.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

namespace oases::plan {
namespace {


// Pipeline settings beyond the names: virtual stages, the number of chunks, and the
// micro-batches an interleaved pipeline needs.
void check_pipeline_settings(const RunConfig& config, schedule::PipelineKind kind) {
  const ParallelConfig& p = config.parallel;
  const std::int64_t v = p.virtual_stages;
  const bool interleaved = kind == schedule::PipelineKind::interleaved;
  OASES_CHECK(v >= 1, "parallel.virtual_stages = {} must be at least 1", v);
  OASES_CHECK(v == 1 || interleaved,
              "parallel.virtual_stages = {} needs parallel.pipeline = \"interleaved\" (found "
              "\"{}\"); valid: virtual_stages = 1, or pipeline = \"interleaved\"",
              v, p.pipeline);
  if (p.pp == 1) {
    OASES_CHECK(v == 1,
                "parallel.virtual_stages = {} needs a pipeline to interleave; valid: "
                "virtual_stages = 1 with parallel.pp = 1, or parallel.pp of 2 or more",
                v);
    return;
  }
  OASES_CHECK(!interleaved || v >= 2,
              "parallel.pipeline = \"interleaved\" needs parallel.virtual_stages of 2 or more "
              "model chunks per rank (found {}); valid: virtual_stages = 2, 3, ..., or pipeline = "
              "\"1f1b\" for one chunk per rank",
              v);
  std::int64_t chunks = 0;
  OASES_CHECK(!__builtin_mul_overflow(p.pp, v, &chunks) && chunks <= config.model.layers,
              "parallel.pp x parallel.virtual_stages = {} x {} chunks is more than model.layers "
              "= {}: each chunk needs at least one layer; valid: virtual_stages up to {}",
              p.pp, v, config.model.layers, std::max<std::int64_t>(1, config.model.layers / p.pp));
  if (!interleaved) return;
  const OptimConfig& t = config.train;
  std::int64_t micro_dp = 0;
  if (t.global_batch < 1 || __builtin_mul_overflow(t.micro_batch, p.dp, &micro_dp) ||
      micro_dp <= 0 || t.global_batch % micro_dp != 0)
    return;  // the batch arithmetic's own error comes later
  const std::int64_t micro_batches = t.global_batch / micro_dp;
  if (micro_batches % p.pp == 0) return;
  // Interleaved runs micro-batches through each chunk in groups of pp.
  const std::int64_t group = micro_dp * p.pp;
  const std::int64_t below = t.global_batch / group * group, above = below + group;
  OASES_FAIL(
      "parallel.pipeline = \"interleaved\" needs the micro-batches per step, "
      "train.global_batch / (train.micro_batch x parallel.dp) = {} / ({} x {}) = {}, to "
      "be a multiple of parallel.pp = {}; valid: train.global_batch = {}{} (multiples of "
      "{} x {} x {} = {})",
      t.global_batch, t.micro_batch, p.dp, micro_batches, p.pp,
      below > 0 ? fmt::format("{} or ", below) : std::string(), above, t.micro_batch, p.dp, p.pp,
      group);
}

void check_mesh_and_layers(const RunConfig& c, const Settings& s) {
  const ParallelConfig& p = c.parallel;
  OASES_CHECK(p.tp >= 1 && p.dp >= 1 && p.pp >= 1,
              "parallel.tp, dp, pp must be at least 1 (found tp={}, dp={}, pp={})", p.tp, p.dp,
              p.pp);
  OASES_CHECK(p.pp <= c.model.layers,
              "parallel.pp = {} is more than model.layers = {}: each pipeline stage needs at "
              "least one layer; valid: 1 to {}",
              p.pp, c.model.layers, c.model.layers);
  check_pipeline_settings(c, s.pipeline);
  c.model.validate_tensor_parallel(p.tp);
  if (s.plan == LayerPlanSource::listed || s.plan == LayerPlanSource::file) {
    // Degrees listed inline are checked here; a plan file when it is read (layer_degrees).
    // The error_code form: a name the system cannot look up (too long, say) is no plan file.
    std::error_code ec;
    if (s.plan == LayerPlanSource::listed) parse_degree_list(p.plan, c.model.layers, p.tp);
    else
      OASES_CHECK(std::filesystem::exists(p.plan, ec),
                  "parallel.plan = \"{}\" is neither \"uniform\", \"auto\", degrees per layer "
                  "like \"1,2,2,1\", nor an existing plan file",
                  p.plan);
  }
  resolve_pipeline(c, s);
  // The planner profiles and solves one whole model on tp x dp ranks; it has no notion of
  // stages yet. Explicit degrees (a list or a plan file) do run under a pipeline.
  OASES_CHECK(p.pp == 1 || s.plan != LayerPlanSource::automatic,
              "parallel.plan = \"auto\" with parallel.pp = {}: the planner does not plan "
              "pipeline stages yet; valid: parallel.plan = \"uniform\", explicit degrees per "
              "layer (e.g. \"{}{}\") or a plan file, or parallel.pp = 1 with \"auto\"",
              p.pp,
              fmt::join(std::vector<std::int64_t>(
                            static_cast<std::size_t>(std::clamp<std::int64_t>(c.model.layers, 1, 8)),
                            p.tp),
                        ","),
              c.model.layers > 8 ? ",..." : "");
}

void check_experts(const RunConfig& c, const Settings& s) {
  const ParallelConfig& p = c.parallel;
  OASES_CHECK(p.ep >= 1, "parallel.ep = {} must be at least 1", p.ep);
  if (p.ep > 1) {
    OASES_CHECK(c.model.has_moe(),
                "parallel.ep = {} splits the experts of mixture-of-experts layers, but the model "
                "has none (model.moe_every = 0); set parallel.ep = 1 or model.moe_every > 0",
                p.ep);
    OASES_CHECK(p.dp % p.ep == 0,
                "parallel.ep = {} must divide parallel.dp = {}: the expert-parallel group is made "
                "of data-parallel ranks; valid: a divisor of {}",
                p.ep, p.dp, p.dp);
    OASES_CHECK(p.dp_sync_every == 1,
                "parallel.dp_sync_every = {} with parallel.ep = {}: local SGD averages the "
                "data-parallel replicas, which hold different experts under expert parallelism; "
                "use parallel.dp_sync_every = 1 or parallel.ep = 1",
                p.dp_sync_every, p.ep);
    OASES_CHECK(c.model.experts % p.ep == 0,
                "model.experts = {} is not divisible by parallel.ep = {}: each expert-parallel "
                "rank holds model.experts / parallel.ep whole experts; use an ep that divides {}",
                c.model.experts, p.ep, c.model.experts);
  }
  // Checked on dense models too: a setting the run cannot take is an error wherever it appears.
  OASES_CHECK(p.expert_tp == 0 || p.expert_tp == 1 || p.expert_tp == p.tp,
              "parallel.expert_tp = {} with parallel.tp = {}: experts are either whole on each "
              "rank (1) or split over the layer's tensor-parallel ranks ({}; 0, the default, "
              "means the same)",
              p.expert_tp, p.tp, p.tp);
  if (c.model.has_moe()) {
    if (p.expert_tp == 1 && p.tp > 1 && s.plan == LayerPlanSource::listed) {
      const std::vector<int> degrees = parse_degree_list(p.plan, c.model.layers, p.tp);
      for (std::int64_t l = 0; l < c.model.layers; ++l)
        OASES_CHECK(!c.model.is_moe_layer(l) || degrees[static_cast<std::size_t>(l)] == 1,
                    "parallel.plan = \"{}\" gives layer {} (a mixture-of-experts layer) degree {}, "
                    "but parallel.expert_tp = 1 keeps its experts whole, which runs the layer at "
                    "degree 1; give MoE layers 1 in the plan, or set parallel.expert_tp = {} to "
                    "split the experts",
                    p.plan, l, degrees[static_cast<std::size_t>(l)], p.tp);
    }
    OASES_CHECK(!s.activation_compression.any(),
                "parallel.activation_compression = \"{}\" with mixture-of-experts layers "
                "(model.moe_every = {}): the MoE segments keep token indices beside their rows, "
                "which an encoding would round; use \"none\"",
                p.activation_compression, c.model.moe_every);
  }
}

void check_context_parallelism(const RunConfig& c, const Settings& s) {
  const ParallelConfig& p = c.parallel;
  OASES_CHECK(p.cp >= 1, "parallel.cp = {} must be at least 1 (1: no context parallelism)", p.cp);
  if (p.cp == 1) return;
  OASES_CHECK(c.model.seq_len % (2 * p.cp) == 0,
              "parallel.cp = {}: model.seq_len = {} must be divisible by 2 x cp = {} (each rank "
              "holds two of 2 x cp equal chunks of every sequence); valid: a cp with 2 x cp "
              "dividing {}",
              p.cp, c.model.seq_len, 2 * p.cp, c.model.seq_len);
  const std::int64_t heads = c.model.heads / p.tp, kv_heads = c.model.kv_head_count() / p.tp;
  OASES_CHECK(s.context_parallel == ops::ContextParallelKind::ring ||
                  (heads % p.cp == 0 && kv_heads % p.cp == 0),
              "parallel.cp_kind = \"all-to-all\" trades sequence shards for head shards: the "
              "heads ({}) and kv heads ({}) of each tensor-parallel rank (model.heads = {}, "
              "kv heads = {}, parallel.tp = {}) must both be divisible by parallel.cp = {}; valid "
              "cp: a common divisor of {} and {}, or parallel.cp_kind = \"ring\"",
              heads, kv_heads, c.model.heads, c.model.kv_head_count(), p.tp, p.cp, heads, kv_heads);
  const auto not_yet = [&](bool ok, std::string_view setting) {
    OASES_CHECK(ok,
                "parallel.cp = {} is not available with {} yet; valid: parallel.cp = 1, or "
                "leave that setting at its default",
                p.cp, setting);
  };
  not_yet(!c.model.has_moe(), fmt::format("model.moe_every = {}", c.model.moe_every));
  OASES_CHECK(!p.sequence_parallel || c.model.seq_len / p.cp * c.train.micro_batch % p.tp == 0,
              "parallel.sequence_parallel = true with parallel.cp = {}: each rank's {} tokens of "
              "a micro-batch (model.seq_len / cp x train.micro_batch) must be divisible by "
              "parallel.tp = {}",
              p.cp, c.model.seq_len / p.cp * c.train.micro_batch, p.tp);
  not_yet(p.dp_sync_every == 1, fmt::format("parallel.dp_sync_every = {}", p.dp_sync_every));
  not_yet(s.pipeline != schedule::PipelineKind::two_bw,
          fmt::format("parallel.pipeline = \"{}\"", p.pipeline));
}

void check_communication(const RunConfig& c) {
  const ParallelConfig& p = c.parallel;
  OASES_CHECK(p.memory_limit >= 0, "parallel.memory_limit = {} must be >= 0 bytes", p.memory_limit);
  OASES_CHECK(p.bucket_bytes == 0 || p.bucket_bytes >= 1024,
              "parallel.bucket_bytes = {} is too small to carry a collective; valid: 0 (no "
              "bound) or at least 1024 bytes (e.g. 50000000, about what DeepSpeed's buckets "
              "hold)",
              p.bucket_bytes);
  OASES_CHECK(p.comm_timeout_s >= 0, "parallel.comm_timeout_s = {} must be >= 0 seconds (0: no timeout)",
              p.comm_timeout_s);
  OASES_CHECK(p.startup_timeout_s >= 0,
              "parallel.startup_timeout_s = {} must be >= 0 seconds (0: no timeout)",
              p.startup_timeout_s);

}

void check_batches(const RunConfig& c, const Settings& s) {
  const ParallelConfig& p = c.parallel;
  const OptimConfig& t = c.train;
  OASES_CHECK(t.micro_batch >= 1, "train.micro_batch = {} must be at least 1", t.micro_batch);
  OASES_CHECK(t.global_batch >= 1, "train.global_batch = {} must be at least 1", t.global_batch);
  std::int64_t micro_dp = 0;
  OASES_CHECK(!__builtin_mul_overflow(t.micro_batch, p.dp, &micro_dp),
              "train.micro_batch x parallel.dp = {} x {} is too large", t.micro_batch, p.dp);
  if (t.global_batch % micro_dp != 0) {
    OASES_FAIL(
        "train.global_batch = {} must be a multiple of train.micro_batch x parallel.dp = "
        "{} x {} = {} (global batch = micro_batch x accumulation steps x dp); try "
        "global_batch = {}{}",
        t.global_batch, t.micro_batch, p.dp, micro_dp,
        std::max<std::int64_t>(1, t.global_batch / micro_dp) * micro_dp,
        t.global_batch % t.micro_batch != 0
            ? std::string()
            : fmt::format(", or dp in {{{}}}", divisors_of(t.global_batch / t.micro_batch)));
  }
  if (s.pipeline == schedule::PipelineKind::two_bw) {
    // A 2bw step's micro-batches must outnumber the stages: a batch's last backwards then
    // overlap the next batch's first forwards without two of them sharing a micro-batch slot.
    const std::int64_t micro_batches = t.global_batch / micro_dp;
    OASES_CHECK(micro_batches > p.pp,
                "parallel.pipeline = \"2bw\" needs more micro-batches per step than pipeline "
                "stages, but train.global_batch = {} / (train.micro_batch x parallel.dp = {} x "
                "{}) = {} micro-batches with parallel.pp = {}; valid: train.global_batch = {}, "
                "{}, ... (a multiple of {} above {}), or parallel.pp below {}",
                t.global_batch, t.micro_batch, p.dp, micro_batches, p.pp,
                (p.pp + 1) * micro_dp, (p.pp + 2) * micro_dp, micro_dp, p.pp * micro_dp,
                micro_batches);
  }
}

void check_optimization(const RunConfig& c, const Settings& s) {
  const OptimConfig& t = c.train;
  OASES_CHECK(t.steps >= 0, "train.steps = {} must be >= 0", t.steps);
  // train.lr = 0 is Adafactor's relative step size, which is its own schedule: min_lr is not
  // used, and there is no rate to warm up to.
  const bool relative_step = s.optimizer == optim::OptimizerKind::adafactor && t.lr == 0;
  OASES_CHECK(t.lr > 0 || relative_step,
              "train.lr = {} must be positive (0 only with train.optimizer = \"adafactor\", "
              "for its relative step size)",
              t.lr);
  OASES_CHECK(relative_step || (t.min_lr >= 0 && t.min_lr <= t.lr),
              "train.min_lr = {} must be in [0, train.lr = {}]", t.min_lr, t.lr);
  OASES_CHECK(!relative_step || t.warmup_steps == 0,
              "train.warmup_steps = {} has no rate to warm up to: train.lr = 0 gives Adafactor's "
              "relative step size min(1e-2, 1/sqrt(step)); set train.warmup_steps = 0, or "
              "train.lr > 0",
              t.warmup_steps);
  OASES_CHECK(t.warmup_steps >= 0, "train.warmup_steps = {} must be >= 0", t.warmup_steps);
  OASES_CHECK(t.lr_decay_steps >= 0, "train.lr_decay_steps = {} must be >= 0", t.lr_decay_steps);
  OASES_CHECK(t.weight_decay >= 0, "train.weight_decay = {} must be >= 0", t.weight_decay);
  OASES_CHECK(t.beta1 >= 0 && t.beta1 < 1, "train.beta1 = {} must be in [0, 1)", t.beta1);
  OASES_CHECK(t.beta2 >= 0 && t.beta2 < 1, "train.beta2 = {} must be in [0, 1)", t.beta2);
  OASES_CHECK(t.eps > 0, "train.eps = {} must be positive", t.eps);
  OASES_CHECK(t.grad_clip >= 0, "train.grad_clip = {} must be >= 0 (0 disables clipping)",
              t.grad_clip);
  OASES_CHECK(t.max_loss >= 0, "train.max_loss = {} must be >= 0 (0: no limit)", t.max_loss);
  optim::validate_optimizer_config(optimizer_config(t, s.optimizer));
}

void check_precision_and_run(const RunConfig& c, const Settings& s) {
  const OptimConfig& t = c.train;
  OASES_CHECK(s.grad_reduce == GradReduceType::fp32 || s.precision == Precision::bf16 ||
                  s.precision == Precision::fp16,
              "train.grad_reduce_dtype = \"{}\" needs mixed precision (train.precision = "
              "\"bf16\" or \"fp16\"); train.precision is \"{}\", whose gradients are reduced "
              "in their own type",
              t.grad_reduce_dtype, t.precision);
  // Scales below 1 would shrink fp16 gradients towards underflow, the opposite of their use.
  OASES_CHECK(t.loss_scale == 0 || t.loss_scale >= 1,
              "train.loss_scale = {} must be 0 (dynamic scaling) or at least 1 (a constant scale)",
              t.loss_scale);
  OASES_CHECK(t.min_loss_scale >= 1, "train.min_loss_scale = {} must be at least 1",
              t.min_loss_scale);
  OASES_CHECK(t.initial_loss_scale >= t.min_loss_scale,
              "train.initial_loss_scale = {} must be at least train.min_loss_scale = {}",
              t.initial_loss_scale, t.min_loss_scale);
  OASES_CHECK(t.loss_scale_window >= 1, "train.loss_scale_window = {} must be at least 1",
              t.loss_scale_window);
  OASES_CHECK(t.hysteresis >= 1, "train.hysteresis = {} must be at least 1", t.hysteresis);
  OASES_CHECK(t.seed >= 0, "train.seed = {} must be >= 0", t.seed);
  OASES_CHECK(t.eval_every >= 0, "train.eval_every = {} must be >= 0 (0: never)", t.eval_every);
  OASES_CHECK(t.eval_steps >= 1, "train.eval_steps = {} must be at least 1", t.eval_steps);
  OASES_CHECK(t.threads >= 0, "train.threads = {} must be >= 0 (0: automatic, the host's cores shared among its ranks)", t.threads);
}

void check_data_checkpoint_and_log(const RunConfig& c, const Settings& s) {
  OASES_CHECK(c.data.tokenizer_model.empty() || s.tokenizer != data::TokenizerKind::byte,
              "data.tokenizer_model = \"{}\" is set, but data.tokenizer = \"{}\" reads no model "
              "file; unset it, or set data.tokenizer to the tokenizer the file belongs to "
              "(\"gpt2\", \"bpe\", \"wordpiece\" or \"sentencepiece\")",
              c.data.tokenizer_model, c.data.tokenizer);
  OASES_CHECK(c.checkpoint.every >= 0, "checkpoint.every = {} must be >= 0", c.checkpoint.every);
  OASES_CHECK(c.checkpoint.keep >= 0, "checkpoint.keep = {} must be >= 0 (0 keeps all)",
              c.checkpoint.keep);
  OASES_CHECK(!c.checkpoint.resume || !c.checkpoint.dir.empty(),
              "checkpoint.resume = true needs checkpoint.dir to name the run's checkpoint folder");
  // A directory where the run writes a file: the trace's temporary would go beside it
  // ("/tmp" put "/tmp.<random>.tmp" at the root) and the metrics could not be opened.
  for (const auto& [setting, path, example] :
       {std::tuple{"log.metrics", &c.log.metrics, "metrics.jsonl"},
        std::tuple{"log.trace", &c.log.trace, "trace.json"}}) {
    std::error_code ec;
    OASES_CHECK(path->empty() || !std::filesystem::is_directory(*path, ec),
                "{} = \"{}\" is a directory; name a file to write, such as \"{}\"", setting,
                *path, (std::filesystem::path(*path) / example).string());
  }
  OASES_CHECK(c.log.every >= 1, "log.every = {} must be at least 1", c.log.every);
  OASES_CHECK(std::isfinite(c.train.straggler_warn_ratio) && c.train.straggler_warn_ratio >= 1,
              "train.straggler_warn_ratio = {} must be a number >= 1 (a rank's compute per step "
              "over the median rank's; 1.2 warns of a rank 20% slower)",
              c.train.straggler_warn_ratio);
  OASES_CHECK(c.log.trace_steps >= 1, "log.trace_steps = {} must be at least 1", c.log.trace_steps);
  OASES_CHECK(c.log.flight_records >= 0 && c.log.flight_records <= 100'000,
              "log.flight_records = {} must lie in [0, 100000] (operations each communicator "
              "remembers; 0: no flight recorder)",
              c.log.flight_records);
  OASES_CHECK(c.log.peak_tflops >= 0, "log.peak_tflops = {} must be >= 0 (0: measure)",
              c.log.peak_tflops);
}

void check_combinations(const RunConfig& c, const Settings& s) {
  const ParallelConfig& p = c.parallel;
  const OptimConfig& t = c.train;
  resolve_schedule(c, s);
  OASES_CHECK(!s.activation_compression.any() || s.pipeline != schedule::PipelineKind::two_bw,
              "parallel.activation_compression = \"{}\" does not run with parallel.pipeline = "
              "\"2bw\" yet (its runs carry kept sets from one step to the next); valid: "
              "parallel.activation_compression = \"none\", or another parallel.pipeline",
              p.activation_compression);
  OASES_CHECK(!p.partition_activations || !s.activation_compression.any(),
              "parallel.partition_activations = true with parallel.activation_compression = "
              "\"{}\" is not supported yet (a checkpoint's slice is not held encoded); valid: "
              "one of the two, i.e. parallel.activation_compression = \"none\" or "
              "parallel.partition_activations = false",
              p.activation_compression);
  if (s.precision == Precision::bf16) {
    const std::int64_t layer =
        s.activation_compression.first_layer_in(ops::ActivationEncoding::bf16);
    const bool listed = !s.activation_compression.layers.empty();
    OASES_CHECK(layer < 0,
                "parallel.activation_compression = \"{}\"{} with train.precision = \"bf16\" "
                "would change nothing (the kept activations are bf16 already); valid{} \"fp8\" "
                "(a quarter of fp32, half of bf16) or \"none\"",
                p.activation_compression,
                listed ? fmt::format(" gives layer {} \"bf16\", which", layer) : std::string(),
                listed ? " per layer:" : ": parallel.activation_compression =");
  }
  OASES_CHECK(s.precision != Precision::fp16 || s.pipeline != schedule::PipelineKind::two_bw,
              "train.precision = \"fp16\" does not run with parallel.pipeline = \"2bw\" (a step "
              "skipped for an overflow would break its stream of weight versions); valid: "
              "train.precision = \"bf16\" (no loss scaling), or another parallel.pipeline");
  if (p.sequence_parallel) {
    OASES_CHECK(p.tp > 1,
                "parallel.sequence_parallel = true splits the tokens over the tensor-parallel "
                "group, but parallel.tp = {}; valid: parallel.tp > 1, or sequence_parallel = false",
                p.tp);
    OASES_CHECK(c.model.seq_len % p.tp == 0,
                "parallel.sequence_parallel = true: model.seq_len = {} must be divisible by "
                "parallel.tp = {} (each rank holds seq_len / tp of every sequence's tokens)",
                c.model.seq_len, p.tp);
  }
  OASES_CHECK(p.dp_sync_every >= 1,
              "parallel.dp_sync_every = {} must be at least 1 (1: gradients summed over the "
              "data-parallel group every step; x > 1: replicas average every x steps)",
              p.dp_sync_every);
  OASES_CHECK(p.dp_sync_every == 1 || s.plan == LayerPlanSource::uniform,
              "parallel.dp_sync_every = {} needs parallel.plan = \"uniform\" (a layer below the "
              "tensor-parallel degree sums its gradient over tensor- and data-parallel replicas "
              "at once); parallel.plan is \"{}\"",
              p.dp_sync_every, p.plan);
  OASES_CHECK(p.dp_sync_every == 1 || s.pipeline != schedule::PipelineKind::two_bw,
              "parallel.dp_sync_every = {} does not run with parallel.pipeline = \"2bw\" "
              "(its steps carry a batch into the next); valid: parallel.dp_sync_every = 1, or "
              "another parallel.pipeline",
              p.dp_sync_every);
  OASES_CHECK(p.zero >= 0 && p.zero <= 3,
              "parallel.zero = {} is not a ZeRO stage; valid: 0 (none), 1 (optimizer state "
              "partitioned), 2 (and gradients), 3 (and parameters)",
              p.zero);
  OASES_CHECK(p.zero == 0 || p.dp_sync_every == 1,
              "parallel.zero = {} with parallel.dp_sync_every = {}: local SGD keeps a whole "
              "optimizer state on each replica and sums no gradients; valid: parallel.zero = 0, "
              "or parallel.dp_sync_every = 1",
              p.zero, p.dp_sync_every);
  OASES_CHECK(s.offload == Offload::none || !p.offload_dir.empty(),
              "parallel.offload = \"{}\" needs parallel.offload_dir: a folder on local disk for "
              "the scratch file that holds the offloaded state",
              p.offload);
  OASES_CHECK(s.offload != Offload::optimizer_and_params || s.precision == Precision::bf16 ||
                  s.precision == Precision::fp16,
              "parallel.offload = \"optimizer+params\" needs train.precision = \"bf16\" or "
              "\"fp16\" (forward and backward then read the 16-bit copy; at \"{}\" they read the "
              "master weights themselves); valid: parallel.offload = \"optimizer\"",
              t.precision);
}

void check_run_length(const RunConfig& c) {
  const OptimConfig& t = c.train;
  // Last: each setting's own error above is the more useful one.
  {
    // Batch b of the run reads token positions up to about b x global_batch x (seq_len + 1);
    // those indices are 64-bit, so the whole run must fit well inside that range.
    const long double positions = static_cast<long double>(t.steps) *
                                  static_cast<long double>(t.global_batch) *
                                  static_cast<long double>(c.model.seq_len + 1);
    const std::int64_t limit = std::int64_t{1} << 62;
    OASES_CHECK(positions <= static_cast<long double>(limit),
                "train.steps = {} is too large: steps x train.global_batch x (model.seq_len + 1) "
                "must stay below 2^62 token positions; valid: at most {} steps",
                t.steps,
                static_cast<std::int64_t>(static_cast<long double>(limit) /
                                          (static_cast<long double>(t.global_batch) *
                                           static_cast<long double>(c.model.seq_len + 1))));
  }
}

}  // namespace

void RunConfig::validate() const {
  model.validate();
  const Settings settings = parse_settings(*this);
  check_mesh_and_layers(*this, settings);
  check_experts(*this, settings);
  check_context_parallelism(*this, settings);
  check_communication(*this);
  check_batches(*this, settings);
  check_optimization(*this, settings);
  check_precision_and_run(*this, settings);
  check_data_checkpoint_and_log(*this, settings);
  check_combinations(*this, settings);
  // Last: each setting's own error above is the more useful one.
  check_run_length(*this);
}

}  // namespace oases::plan
