#include "planner/pipeline_plan.h"

#include "core/error.h"
#include "planner/cost_model.h"
#include "schedule/pipeline_lowering.h"
#include "sim/schedule_sim.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace oases::planner {
namespace {

const DegreeProfile& full_degree(const Profile& profile) {
  const DegreeProfile* d = profile.at_degree(profile.tp);
  OASES_CHECK(d != nullptr,
              "the profile has no measurements at tensor-parallel degree {} (its parallel.tp); "
              "measure it again with `oases profile`",
              profile.tp);
  return *d;
}

// Rows of one segment instance: a sub-batch of the whole tensor-parallel group.
double sub_batch_rows(const schedule::ScheduleSpec& spec, std::int64_t micro_batch) {
  return static_cast<double>(micro_batch) / spec.sub_batches;
}

// Kept activations of one micro-batch of `program` under `spec`, as the schedule frees them.
std::int64_t peak_of(const ops::Program& program, const schedule::ScheduleSpec& spec) {
  return static_cast<std::int64_t>(
      schedule::peak_activation_bytes(program, schedule::generate(program, spec)));
}

// The chunk (in [0, chunks)) each segment of the whole-model `program` belongs to: the
// embedding to the first, the head's segments to the last, a layer's to the chunk holding it.
std::vector<int> chunk_of_segments(const ops::Program& program, const std::vector<int>& counts) {
  std::vector<int> chunk_of_layer;
  for (int c = 0; c < static_cast<int>(counts.size()); ++c)
    chunk_of_layer.insert(chunk_of_layer.end(), static_cast<std::size_t>(counts[c]), c);
  std::vector<int> out;
  for (std::size_t s = 0; s < program.segments.size(); ++s) {
    const int layer = program.segments[s].layer;
    if (layer >= 0)
      out.push_back(chunk_of_layer.at(static_cast<std::size_t>(layer)));
    else
      out.push_back(s == 0 ? 0 : static_cast<int>(counts.size()) - 1);
  }
  return out;
}

// Rank `rank`'s program: the segments of its chunks (rank, rank + P, ...) in model order, with
// the peer flags at each chunk's ends (ops/program.h).
ops::Program rank_program(const ops::Program& whole, const std::vector<int>& chunk_of, int rank,
                          int stages, int chunks) {
  std::vector<int> local(whole.segments.size(), -1);
  ops::Program out;
  for (std::size_t s = 0; s < whole.segments.size(); ++s) {
    if (chunk_of[s] % stages != rank) continue;
    local[s] = static_cast<int>(out.segments.size());
    ops::SegmentShape shape = whole.segments[s];
    for (int& read : shape.reads_sets_of) read = local.at(static_cast<std::size_t>(read));
    if (shape.residual_of >= 0)
      shape.residual_of = local.at(static_cast<std::size_t>(shape.residual_of));
    const int c = chunk_of[s];
    shape.input_from_peer = c > 0 && (s == 0 || chunk_of[s - 1] != c);
    shape.output_to_peer = c < chunks - 1 && (s + 1 == whole.segments.size() || chunk_of[s + 1] != c);
    out.segments.push_back(std::move(shape));
  }
  return out;
}

}  // namespace

StageCosts pipeline_stage_costs(const Profile& profile, const schedule::ScheduleSpec& within_stage,
                                std::int64_t micro_batch, int in_flight,
                                std::int64_t memory_limit) {
  const DegreeProfile& d = full_degree(profile);
  const int T = profile.tp;
  const auto layers = static_cast<int>(profile.model.layers);
  const double rows = sub_batch_rows(within_stage, micro_batch);
  schedule::ScheduleSpec one = within_stage;
  one.micro_batches = 1;
  one.training = true;
  const ops::Program program = program_at(profile, T, rows, layers);
  const sim::CostModel costs = costs_at(profile, T, rows, program);
  StageCosts out;
  out.layer_seconds.assign(static_cast<std::size_t>(layers), 0.0);
  for (const schedule::Instruction& ins : schedule::generate(program, one)) {
    if (ins.op != schedule::Op::forward && ins.op != schedule::Op::recompute &&
        ins.op != schedule::Op::backward)
      continue;
    const double seconds = costs.compute(ins);
    const int layer = program.segments[static_cast<std::size_t>(ins.segment)].layer;
    if (layer >= 0)
      out.layer_seconds[static_cast<std::size_t>(layer)] += seconds;
    else if (ins.segment == 0)
      out.embedding_seconds += seconds;
    else
      out.head_seconds += seconds;
  }
  if (memory_limit <= 0) return out;
  // State: parameters, gradients and the optimizer's state, as the cost model counts them.
  const auto state = [&](std::int64_t parameter_bytes) {
    return state_memory(profile, parameter_bytes).state();
  };
  // One layer's kept activations: the model with L layers against the model with L - 1, as
  // the planner prices a layer.
  const std::int64_t without_layers = peak_of(program_at(profile, T, rows, 0), one);
  const std::int64_t per_layer =
      (peak_of(program, one) - without_layers) / std::max(1, layers);
  out.layer_bytes.assign(static_cast<std::size_t>(layers),
                         state(d.parameter_bytes_per_layer) + in_flight * per_layer);
  const double factor = rows / static_cast<double>(d.rows);
  const std::int64_t rest =
      state(d.parameter_bytes - layers * d.parameter_bytes_per_layer) +
      static_cast<std::int64_t>(std::llround(static_cast<double>(d.static_activation_bytes) * factor)) +
      in_flight * without_layers;
  out.embedding_bytes = rest;
  out.head_bytes = rest;
  out.chunk_memory_limit = memory_limit;
  return out;
}

std::vector<int> auto_pipeline_layers(const Profile& profile,
                                      const schedule::ScheduleSpec& within_stage,
                                      const schedule::PipelineSpec& pipeline,
                                      std::int64_t micro_batch, std::int64_t memory_limit) {
  const std::vector<int> live = schedule::max_in_flight(schedule::pipeline_orders(pipeline));
  // An interleaved chunk holds 1 / v of a rank's layers, so v of its micro-batches weigh one
  // micro-batch of the rank's layers (schedule/pipeline.h).
  const int in_flight = (*std::max_element(live.begin(), live.end()) + pipeline.virtual_stages - 1) /
                        pipeline.virtual_stages;
  const StageCosts costs =
      pipeline_stage_costs(profile, within_stage, micro_batch, std::max(1, in_flight), memory_limit);
  try {
    return balance_stages(costs, pipeline.chunks());
  } catch (const UserError& e) {
    if (memory_limit <= 0) throw;
    OASES_FAIL("parallel.memory_limit = {} bytes per rank, with {} micro-batches in flight under "
               "parallel.pipeline = \"{}\": {}",
               memory_limit, in_flight, schedule::name(pipeline.kind), e.what());
  }
}

double PipelineOption::mean_bubble_seconds() const {
  if (bubble_seconds.empty()) return 0;
  return std::accumulate(bubble_seconds.begin(), bubble_seconds.end(), 0.0) /
         static_cast<double>(bubble_seconds.size());
}

namespace {

// The prediction of `kind` with `v` chunks per rank over the split `counts` (P v counts).
PipelineOption predict_one(const Profile& profile, const schedule::ScheduleSpec& within_stage,
                           std::int64_t micro_batch, const PipelinePredictionOptions& options,
                           schedule::PipelineKind kind, int v, const std::vector<int>& counts) {
  PipelineOption option;
  option.kind = kind;
  option.virtual_stages = v;
  option.layers_per_chunk = counts;
  const int P = options.stages;
  const int T = profile.tp;
  const double rows = sub_batch_rows(within_stage, micro_batch);
  const ops::Program whole = program_at(profile, T, rows);
  const std::vector<int> chunk_of = chunk_of_segments(whole, counts);
  schedule::PipelineSpec pipeline{kind, P, v, options.micro_batches};
  schedule::ScheduleSpec spec = within_stage;
  spec.micro_batches = options.micro_batches;
  spec.training = true;
  std::vector<ops::Program> programs;
  std::vector<schedule::Schedule> schedules;
  try {
    for (int r = 0; r < P; ++r) {
      programs.push_back(rank_program(whole, chunk_of, r, P, P * v));
      schedules.push_back(schedule::lower_pipeline(programs.back(), spec, pipeline, r));
    }
  } catch (const UserError& e) {
    option.unavailable = e.what();
    return option;
  }
  std::vector<sim::CostModel> per_rank;
  for (int r = 0; r < P; ++r)
    per_rank.push_back(costs_at(profile, T, rows, programs[static_cast<std::size_t>(r)],
                                full_degree(profile).overlap_slowdown));
  // Instructions name their chunk; the chunk's rank holds the program its segment indexes.
  const auto rank_of = [P](const schedule::Instruction& ins) {
    return static_cast<std::size_t>(ins.chunk % P);
  };
  sim::CostModel costs = per_rank.front();
  costs.compute = [&](const schedule::Instruction& ins) { return per_rank[rank_of(ins)].compute(ins); };
  costs.collective = [&](const schedule::Instruction& ins) {
    return per_rank[rank_of(ins)].collective(ins);
  };
  if (options.link_bytes_per_second > 0) {
    // An activation and its gradient have the same shape: [rows, seq, hidden].
    const double bytes = rows * static_cast<double>(profile.model.seq_len * profile.model.hidden *
                                                    profile.element_bytes);
    const double seconds = bytes / options.link_bytes_per_second;
    costs.p2p = [seconds](const schedule::Instruction&) { return seconds; };
  }
  const sim::MultiRankResult result = sim::simulate_ranks(schedules, costs);
  option.step_seconds = result.step_seconds;
  for (const sim::RankSimResult& r : result.ranks) {
    option.bubble_seconds.push_back(r.bubble_seconds);
    option.compute_seconds.push_back(r.compute_seconds);
  }
  return option;
}

}  // namespace

std::vector<PipelineOption> predict_pipelines(const Profile& profile,
                                              const schedule::ScheduleSpec& within_stage,
                                              std::int64_t micro_batch,
                                              const PipelinePredictionOptions& options) {
  const auto layers = static_cast<int>(profile.model.layers);
  OASES_CHECK(options.stages >= 2, "parallel.pp = {}: a pipeline needs at least 2 stages",
              options.stages);
  OASES_CHECK(options.micro_batches >= 1, "{} micro-batches per step; at least 1 is needed",
              options.micro_batches);
  // Checks the counts (their number and sum) with parallel.pipeline_layers' messages.
  parse_pipeline_layers(format_pipeline_layers(options.layers_per_stage), layers, options.stages);
  std::vector<PipelineOption> out;
  using schedule::PipelineKind;
  for (const PipelineKind kind : {PipelineKind::gpipe, PipelineKind::one_f_one_b,
                                  PipelineKind::interleaved, PipelineKind::zero_bubble,
                                  PipelineKind::two_bw}) {
    if (kind == PipelineKind::two_bw) {
      // Its runs carry a batch from one step into the next, which the simulator (one step of
      // one batch per rank) does not price.
      PipelineOption option;
      option.kind = kind;
      option.unavailable =
          "not predicted: its steps run on without a flush, carrying a batch from one step "
          "into the next, and the simulator prices one flushed step";
      out.push_back(std::move(option));
      continue;
    }
    if (kind != PipelineKind::interleaved) {
      out.push_back(predict_one(profile, within_stage, micro_batch, options, kind, 1,
                                options.layers_per_stage));
      continue;
    }
    const int v = 2;
    if (layers < options.stages * v) {
      PipelineOption option;
      option.kind = kind;
      option.virtual_stages = v;
      option.unavailable = fmt::format(
          "needs at least {} layers for {} chunks of {} stages x {} virtual stages; the model "
          "has {}",
          options.stages * v, options.stages * v, options.stages, v, layers);
      out.push_back(std::move(option));
      continue;
    }
    out.push_back(predict_one(profile, within_stage, micro_batch, options, kind, v,
                              uniform_pipeline_layers(layers, options.stages * v)));
  }
  return out;
}

std::string format_pipeline_options(const std::vector<PipelineOption>& options,
                                    const PipelinePredictionOptions& settings) {
  std::string out = fmt::format(
      "pipeline schedules (pp = {}, {} micro-batches per step, layers per stage {}; {}):\n",
      settings.stages, settings.micro_batches, format_pipeline_layers(settings.layers_per_stage),
      settings.link_bytes_per_second > 0
          ? fmt::format("point-to-point links at {:.3g} GB/s", settings.link_bytes_per_second / 1e9)
          : std::string("point-to-point transfers not priced"));
  for (const PipelineOption& o : options) {
    std::string kind(schedule::name(o.kind));
    if (o.virtual_stages > 1) kind += fmt::format(" (v = {})", o.virtual_stages);
    if (!o.unavailable.empty()) {
      out += fmt::format("  {:<20} no prediction: {}\n", kind, o.unavailable);
      continue;
    }
    std::string stages;
    for (std::size_t r = 0; r < o.bubble_seconds.size(); ++r)
      stages += fmt::format("{}{:.2f}", r ? " " : "", 1e3 * o.bubble_seconds[r]);
    out += fmt::format(
        "  {:<20} step {:.2f} ms, bubble {:.2f} ms per stage ({:.1f}% of the step); bubble "
        "per stage [{}] ms\n",
        kind, 1e3 * o.step_seconds, 1e3 * o.mean_bubble_seconds(),
        o.step_seconds > 0 ? 100.0 * o.mean_bubble_seconds() / o.step_seconds : 0.0, stages);
  }
  return out;
}

}  // namespace oases::planner
