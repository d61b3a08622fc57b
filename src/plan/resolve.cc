#include "plan/resolve.h"

#include "core/error.h"
#include "planner/planner.h"
#include "planner/stage_partition.h"
#include "schedule/pipeline.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <sstream>

namespace oases::plan {
namespace {

// parallel.recompute_every resolved for the spec's policy: sqrt's layers per group (0: the
// default, round(sqrt(model.layers))); 0 under the other policies, which group no layers.
int resolved_recompute_every(const RunConfig& config, const schedule::ScheduleSpec& spec) {
  const std::int64_t k = config.parallel.recompute_every;
  const std::int64_t layers = config.model.layers;
  if (!spec.layer_recompute.empty() || spec.recompute != schedule::Recompute::sqrt) {
    OASES_CHECK(k == 0,
                "parallel.recompute_every = {} is set, but parallel.recompute resolves to \"{}\", "
                "which recomputes no groups of layers; valid: parallel.recompute = \"sqrt\", or "
                "recompute_every = 0 (unset)",
                k, schedule::recompute_words(spec));
    return 0;
  }
  OASES_CHECK(k >= 0 && k <= layers,
              "parallel.recompute_every = {} is out of range for model.layers = {}; valid: 1 to "
              "{} layers per recomputation group, or 0 for round(sqrt(model.layers)) = {}",
              k, layers, layers, schedule::default_recompute_every(layers));
  return k == 0 ? schedule::default_recompute_every(layers) : static_cast<int>(k);
}

// The policy a kind runs unless told otherwise ("auto").
schedule::Recompute own_recompute(schedule::ScheduleKind kind) {
  switch (kind) {
    case schedule::ScheduleKind::megatron:
      return schedule::Recompute::none;
    case schedule::ScheduleKind::cross_pass:
      return schedule::Recompute::full;
    case schedule::ScheduleKind::fine_grained:
    case schedule::ScheduleKind::oases:
    case schedule::ScheduleKind::oases_interleaved:
    case schedule::ScheduleKind::oases_deferred:
      break;
  }
  return schedule::Recompute::fine_grained;
}

}  // namespace

// The divisors of n, for messages that list the valid values ("1, 2, 4"). Only those up to
// 4096 are tried, so that an absurd setting cannot stall the message; larger ones are
// elided (", ...").
std::string divisors_of(std::int64_t n) {
  constexpr std::int64_t kMaxListed = 4096;
  std::string out;
  for (std::int64_t d = 1; d <= std::min(n, kMaxListed); ++d)
    if (n % d == 0) out += fmt::format("{}{}", out.empty() ? "" : ", ", d);
  if (n > kMaxListed) out += ", ...";
  return out;
}

std::vector<int> parse_degree_list(const std::string& text, std::int64_t layers, std::int64_t tp) {
  std::vector<int> degrees;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    const auto first = item.find_first_not_of(' ');
    const auto last = item.find_last_not_of(' ');
    // The example shows at most 8 layers: model.layers may be anything here.
    OASES_CHECK(first != std::string::npos,
                "parallel.plan = \"{}\": an empty entry; write one degree per layer, e.g. \"{}{}\"",
                text,
                fmt::join(std::vector<std::int64_t>(
                              static_cast<std::size_t>(std::clamp<std::int64_t>(layers, 1, 8)), tp),
                          ","),
                layers > 8 ? ",..." : "");
    const std::string digits = item.substr(first, last - first + 1);
    OASES_CHECK(digits.find(' ') == std::string::npos && digits.size() <= 6,
                "parallel.plan = \"{}\": \"{}\" is not a degree", text, digits);
    degrees.push_back(std::stoi(digits));
  }
  OASES_CHECK(static_cast<std::int64_t>(degrees.size()) == layers,
              "parallel.plan = \"{}\" gives {} layer degrees; the model has model.layers = {}",
              text, degrees.size(), layers);
  for (std::size_t l = 0; l < degrees.size(); ++l)
    OASES_CHECK(degrees[l] >= 1 && tp % degrees[l] == 0,
                "parallel.plan = \"{}\": layer {} has degree {}; valid degrees divide "
                "parallel.tp = {}",
                text, l, degrees[l], tp);
  return degrees;
}

schedule::ScheduleSpec resolve_schedule(const RunConfig& config, const Settings& settings) {
  const ParallelConfig& p = config.parallel;
  schedule::ScheduleSpec spec;
  spec.kind = settings.schedule.value_or(p.tp > 1 ? schedule::ScheduleKind::oases
                                                   : schedule::ScheduleKind::megatron);
  // Under a list, the segments outside the layers keep the kind's own policy (none of them
  // has anything to recompute).
  spec.recompute = settings.recompute.value_or(own_recompute(spec.kind));
  spec.layer_recompute = settings.layer_recompute;
  spec.recompute_every = resolved_recompute_every(config, spec);
  spec.partitioned_checkpoints = p.partition_activations;
  const bool overlapped = schedule::overlaps_collectives(spec.kind);
  const std::int64_t micro = config.train.micro_batch;
  OASES_CHECK(p.sub_batches >= 0, "parallel.sub_batches = {} must be >= 1 (or 0: automatic)",
              p.sub_batches);
  if (p.sub_batches == 0) {
    spec.sub_batches = overlapped && micro % 2 == 0 ? 2 : 1;
  } else {
    if (micro % p.sub_batches != 0)
      OASES_FAIL(
          "parallel.sub_batches = {} must divide train.micro_batch = {} (sub-batches "
          "split each micro-batch along the batch dimension); valid: {}",
          p.sub_batches, micro, divisors_of(micro));
    OASES_CHECK(p.sub_batches <= std::numeric_limits<int>::max(),
                "parallel.sub_batches = {} is too many; at most {}", p.sub_batches,
                std::numeric_limits<int>::max());
    spec.sub_batches = static_cast<int>(p.sub_batches);
  }
  std::int64_t dp_micro = 0;
  const bool divides = !__builtin_mul_overflow(micro, p.dp, &dp_micro) && dp_micro > 0 &&
                       config.train.global_batch % dp_micro == 0;
  const std::int64_t micro_batches = divides ? config.train.global_batch / dp_micro : 1;
  OASES_CHECK(micro_batches <= std::numeric_limits<int>::max(),
              "train.global_batch = {} makes {} micro-batches (of train.micro_batch x "
              "parallel.dp = {} x {} sequences) per step; at most {}",
              config.train.global_batch, micro_batches, micro, p.dp,
              std::numeric_limits<int>::max());
  spec.micro_batches = static_cast<int>(micro_batches);
  schedule::check_spec(spec);
  return spec;
}

PipelinePlan resolve_pipeline(const RunConfig& config, const Settings& settings) {
  OASES_CHECK(config.model.layers <= std::numeric_limits<int>::max(),
              "model.layers = {} is too many to split into pipeline stages; at most {}",
              config.model.layers, std::numeric_limits<int>::max());
  PipelinePlan pipeline;
  pipeline.kind = settings.pipeline;
  pipeline.stages = static_cast<int>(config.parallel.pp);
  pipeline.virtual_stages = static_cast<int>(config.parallel.virtual_stages);
  pipeline.layers = static_cast<int>(config.model.layers);
  const int chunks = pipeline.stages * pipeline.virtual_stages;
  switch (settings.pipeline_layers) {
    case PipelineLayersSource::uniform:
      pipeline.chunk_layers = planner::uniform_pipeline_layers(pipeline.layers, chunks);
      break;
    case PipelineLayersSource::listed:
      pipeline.chunk_layers =
          planner::parse_pipeline_layers(config.parallel.pipeline_layers, pipeline.layers, chunks);
      break;
    case PipelineLayersSource::automatic:
      // Measured and balanced at start-up (train/pipeline_split.h); one chunk has nothing to
      // balance.
      if (chunks == 1) pipeline.chunk_layers = {pipeline.layers};
      break;
  }
  return pipeline;
}

std::vector<int> resolve_layer_degrees(const RunConfig& config, const Settings& settings,
                                       std::optional<PlanFile>* file) {
  const auto& p = config.parallel;
  const model::ModelConfig& model = config.model;
  std::vector<int> degrees;
  switch (settings.plan) {
    case LayerPlanSource::automatic: return {};
    case LayerPlanSource::uniform:
      // Whole experts (parallel.expert_tp = 1) run their layers at degree 1.
      if (p.tp == 1 || p.expert_tp != 1 || !model.has_moe()) return {};
      for (std::int64_t l = 0; l < model.layers; ++l)
        degrees.push_back(model.is_moe_layer(l) ? 1 : static_cast<int>(p.tp));
      return degrees;
    case LayerPlanSource::listed: return parse_degree_list(p.plan, model.layers, p.tp);
    case LayerPlanSource::file: break;
  }
  planner::Plan read = planner::read_plan(p.plan, static_cast<int>(p.tp), model.layers);
  degrees = parse_degree_list(fmt::format("{}", fmt::join(read.degrees, ",")), model.layers, p.tp);
  for (std::int64_t l = 0; l < model.layers && p.expert_tp == 1; ++l)
    OASES_CHECK(!model.is_moe_layer(l) || degrees[static_cast<std::size_t>(l)] == 1,
                "the plan {} gives layer {} (a mixture-of-experts layer) degree {}, but "
                "parallel.expert_tp = 1 runs MoE layers at degree 1; plan with expert_tp = 1, or "
                "set parallel.expert_tp = {}",
                p.plan, l, degrees[static_cast<std::size_t>(l)], p.tp);
  if (file != nullptr)
    *file = PlanFile{p.plan, std::move(read.settings), read.predicted_step_seconds};
  return degrees;
}

optim::OptimizerConfig optimizer_config(const OptimConfig& t, optim::OptimizerKind kind) {
  optim::OptimizerConfig o;
  o.kind = kind;
  o.beta1 = t.beta1;
  o.beta2 = t.beta2;
  o.eps = t.eps;
  o.weight_decay = t.weight_decay;
  o.momentum = t.momentum;
  o.nesterov = t.nesterov;
  o.adafactor_beta1 = t.adafactor_beta1;
  o.relative_step = kind == optim::OptimizerKind::adafactor && t.lr == 0;
  return o;
}

}  // namespace oases::plan
