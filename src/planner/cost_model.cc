#include "planner/cost_model.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace oases::planner {
namespace {

const DegreeProfile& degree_of(const Profile& profile, int degree) {
  const DegreeProfile* d = profile.at_degree(degree);
  OASES_CHECK(d != nullptr, "the profile has no measurements at tensor-parallel degree {}", degree);
  return *d;
}

// Segment kinds in program order: embedding, (attention, mlp) per layer, head.
std::string kind_at(const ops::Program& program, int segment) {
  return segment_kind(program.segments[static_cast<std::size_t>(segment)].name);
}

std::int64_t scaled(std::int64_t bytes, double factor) {
  return static_cast<std::int64_t>(std::llround(static_cast<double>(bytes) * factor));
}

// The shape of a GPT segment of `kind` ("embedding", "attention", "mlp", "head", or an MoE
// layer's "moe_dispatch", "experts", "moe_combine"; layer l of `layers`) at profile degree d
// processing `rows` sequences, set sizes and collective elements scaled from the profile; the
// MoE all-to-alls span `ep` ranks.
ops::SegmentShape segment_shape(const DegreeProfile& d, double rows, const std::string& kind,
                                int l, int layers, int ep) {
  const double factor = rows / static_cast<double>(d.rows);
  const auto elements = [&](const std::string& key) -> std::int64_t {
    const auto it = d.collective_elements.find(key);
    return it == d.collective_elements.end() ? 0 : scaled(it->second, factor);
  };
  const auto bytes = [&](const std::string& set) -> std::size_t {
    const auto k = d.activation_bytes.find(kind);
    if (k == d.activation_bytes.end()) return 0;
    const auto s = k->second.find(set);
    return s == k->second.end() ? 0 : static_cast<std::size_t>(scaled(s->second, factor));
  };
  ops::SegmentShape shape;
  shape.degree = shape.collective_ranks = d.degree;
  if (kind == "embedding") {
    shape.name = kind;
    shape.has_forward_collective = true;
    shape.ready_bucket = 0;
  } else if (kind == "head") {
    // In a group of one the whole head is one segment; otherwise the vocab-parallel loss's
    // reductions split it in three (ops/head_segments.h).
    shape.name = kind;
    shape.has_forward_collective = d.degree > 1;
    shape.forward_reduce = ops::ReduceKind::max;
    shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.sets = ops::kInternals;
    shape.internals_bytes = bytes("internals");
    shape.ready_bucket = layers + 1;
  } else if (kind == "head_softmax" || kind == "head_loss") {
    shape.name = kind;
    shape.has_forward_collective = kind == "head_softmax";
  } else if (kind == "moe_dispatch" || kind == "experts" || kind == "moe_combine") {
    // As ops/moe_segment.cc shapes them: the dispatch's forward all-to-all sends the tokens to
    // their experts (at degree k > 1 its backward all-reduce sums the partial input gradients
    // over the layer's group), the experts' all-to-alls send the results back (forward) and the
    // input gradients back (backward), the combine's forward all-reduce runs over the layer's
    // group and its backward all-to-all sends the rows' gradients to their experts.
    shape.name = kind + "." + std::to_string(l);
    shape.layer = l;
    shape.recomputable = true;
    shape.collective_ranks = ep;
    shape.has_forward_collective = true;
    shape.forward_collective_elements = elements(kind + ".fwd");
    shape.backward_collective_elements = elements(kind + ".bwd");
    shape.checkpoint_bytes = bytes("checkpoint");
    shape.internals_bytes = bytes("internals");
    if (kind == "moe_dispatch") {
      shape.forward_kind = ops::CollectiveKind::all_to_all;
      shape.has_backward_collective = d.degree > 1;
      shape.backward_stages = d.degree > 1 ? 2 : 1;
      shape.sets = ops::kCheckpoint | ops::kInternals;
      shape.checkpoint_replicated = d.degree > 1;
    } else if (kind == "experts") {
      shape.forward_kind = shape.backward_kind = ops::CollectiveKind::all_to_all;
      shape.has_backward_collective = true;
      shape.backward_stages = 2;
      shape.sets = ops::kCheckpoint | ops::kInternals;
    } else {
      shape.backward_kind = ops::CollectiveKind::all_to_all;
      shape.has_backward_collective = true;
      shape.backward_stages = 2;
      shape.sets = ops::kCheckpoint;
      shape.internals_bytes = 0;
    }
  } else {
    shape.name = kind + "." + std::to_string(l);
    shape.has_forward_collective = shape.has_backward_collective = true;
    shape.backward_stages = 2;
    shape.sets = ops::kCheckpoint | ops::kInternals | (kind == "attention" ? ops::kCore : 0);
    shape.checkpoint_bytes = bytes("checkpoint");
    shape.internals_bytes = bytes("internals");
    shape.core_bytes = bytes("core");
    shape.layer = l;
    shape.recomputable = true;
    shape.checkpoint_replicated = d.degree > 1;
    if (kind == "attention") shape.ready_bucket = 1 + l;
  }
  return shape;
}

// The head's segments at the end of `program`, shaped by `shape_of(kind)`.
template <class ShapeOf>
void append_head(ops::Program& program, const ShapeOf& shape_of) {
  const int head = static_cast<int>(program.segments.size());
  program.segments.push_back(shape_of("head"));
  if (!program.segments.back().has_forward_collective) return;
  for (const std::string kind : {"head_softmax", "head_loss"}) {
    program.segments.push_back(shape_of(kind));
    program.segments.back().reads_sets_of = {head};
  }
}

// The training schedule of `spec` for `program`, with its checkpoints partitioned where the spec
// says so (the engine runs the same lowering).
schedule::Schedule training_schedule(const ops::Program& program,
                                     const schedule::ScheduleSpec& spec) {
  schedule::Schedule schedule = schedule::generate(program, spec);
  if (spec.training && spec.partitioned_checkpoints)
    schedule::partition_kept_checkpoints(program, schedule);
  return schedule;
}

// A partitioned checkpoint's gather at degree k moves what a reshard from degree 1 to k moves:
// an all-gather over k ranks of k / T of the sub-batch's rows, 1 / k from each. Degrees the
// profile has no such reshard for are left unpriced.
double checkpoint_gather_seconds(const Profile& profile, int degree) {
  if (degree <= 1) return 0.0;
  const auto it = profile.reshards.find(Profile::reshard_key(1, degree));
  return it == profile.reshards.end() ? 0.0 : it->second;
}

// The feed-forward kinds of a layer: the MLP, or an MoE layer's three segments.
std::vector<std::string> feed_forward_kinds(bool moe) {
  if (!moe) return {"mlp"};
  return {std::begin(kMoeKinds), std::end(kMoeKinds)};
}

std::vector<bool> model_moe_layers(const Profile& profile, int layers) {
  std::vector<bool> moe(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) moe[static_cast<std::size_t>(l)] = profile.model.is_moe_layer(l);
  return moe;
}

// Under expert parallelism the all-to-alls cross the measured link, priced by their per-peer
// volume; in a group of one they keep the profiled time (a local copy).
void price_expert_all_to_alls(const Profile& profile, sim::CostModel& costs,
                              const ops::Program& program) {
  if (profile.ep <= 1) return;
  OASES_CHECK(profile.expert_link.bytes_per_second > 0,
              "the profile prices all-to-alls over parallel.ep = {} ranks but has no measured "
              "expert-parallel link; re-run `oases profile` with parallel.ep = {}",
              profile.ep, profile.ep);
  sim::price_all_to_alls(costs, program,
                         {profile.expert_link.bytes_per_second, profile.expert_link.latency_s});
}

}  // namespace

MemoryBytes resident_memory(const MemoryFigures& m) {
  const std::size_t optimizer_offloaded = std::min(m.offloaded, m.optimizer);
  const std::size_t params_offloaded = std::min(m.offloaded - optimizer_offloaded, m.params);
  MemoryBytes bytes;
  bytes.params = static_cast<std::int64_t>(m.params - params_offloaded);
  bytes.grads = static_cast<std::int64_t>(m.grads);
  bytes.optimizer = static_cast<std::int64_t>(m.optimizer - optimizer_offloaded);
  bytes.activations = static_cast<std::int64_t>(m.activations);
  return bytes;
}

MemoryBytes state_memory(const Profile& profile, std::int64_t parameter_bytes) {
  const auto bytes = static_cast<double>(parameter_bytes);
  const auto rounded = [](double b) { return static_cast<std::int64_t>(std::llround(b)); };
  MemoryBytes m;
  m.params = rounded(profile.param_bytes_ratio * bytes);
  m.grads = rounded(profile.grad_bytes_ratio * bytes);
  m.optimizer = rounded((profile.param_bytes_ratio + profile.grad_bytes_ratio +
                         profile.optimizer_bytes_ratio) *
                        bytes) -
                m.params - m.grads;
  return m;
}

ops::Program program_at(const Profile& profile, int degree, double rows) {
  return program_at(profile, degree, rows, static_cast<int>(profile.model.layers));
}

ops::Program program_at(const Profile& profile, int degree, double rows, int layers) {
  const DegreeProfile& d = degree_of(profile, degree);
  const int ep = profile.ep;
  ops::Program program;
  program.set_element_bytes = static_cast<std::size_t>(profile.element_bytes);
  program.segments.push_back(segment_shape(d, rows, "embedding", -1, layers, ep));
  for (int l = 0; l < layers; ++l) {
    program.segments.push_back(segment_shape(d, rows, "attention", l, layers, ep));
    for (const std::string& kind : feed_forward_kinds(profile.model.is_moe_layer(l)))
      program.segments.push_back(segment_shape(d, rows, kind, l, layers, ep));
  }
  append_head(program,
              [&](const std::string& kind) { return segment_shape(d, rows, kind, -1, layers, ep); });
  return program;
}

double segment_seconds(const SegmentTimes& t, const schedule::Instruction& ins) {
  switch (ins.op) {
    case schedule::Op::forward: return t.forward_s;
    case schedule::Op::recompute:
      // Whole-layer recomputation also reruns the output GEMM and, for the MLP half, the
      // epilogue: a forward pass; the others regenerate what fine-grained recomputation does.
      return ins.sets & ops::kOutput ? t.forward_s : t.recompute_s;
    case schedule::Op::backward: return ins.stage == 0 ? t.backward0_s : t.backward1_s;
    default: return 0.0;
  }
}

sim::CostModel costs_at(const Profile& profile, int degree, double rows,
                        const ops::Program& program, double overlap_slowdown) {
  const DegreeProfile& d = degree_of(profile, degree);
  const double factor = rows / static_cast<double>(d.rows);
  sim::CostModel costs;
  costs.compute = [&program, d, factor](const schedule::Instruction& ins) {
    const auto it = d.segments.find(kind_at(program, ins.segment));
    if (it == d.segments.end()) return 0.0;
    return segment_seconds(it->second, ins) * factor;
  };
  costs.collective = [&program, d, factor](const schedule::Instruction& ins) {
    const std::string key = kind_at(program, ins.segment) +
                            (ins.direction == schedule::Direction::forward ? ".fwd_s" : ".bwd_s");
    const auto it = d.collectives.find(key);
    return it == d.collectives.end() ? 0.0 : it->second * factor;
  };
  const auto layers = static_cast<int>(profile.model.layers);
  const double per_byte =
      d.parameter_bytes_per_layer > 0
          ? d.replica_reduce_per_layer_s / static_cast<double>(d.parameter_bytes_per_layer)
          : 0.0;
  const double rest_bytes =
      static_cast<double>(d.parameter_bytes - layers * d.parameter_bytes_per_layer);
  costs.reduce_grads = [d, layers, per_byte, rest_bytes](int bucket) {
    if (bucket >= 1 && bucket <= layers) return d.replica_reduce_per_layer_s;
    return bucket == 0 ? per_byte * rest_bytes : 0.0;  // embeddings; ln_f is negligible
  };
  costs.optimizer_step = d.optimizer_s;
  costs.gather_sets = [&profile, degree](const schedule::Instruction&) {
    return checkpoint_gather_seconds(profile, degree);
  };
  costs.overlap_slowdown = overlap_slowdown;
  // Measured on the whole group, whose traffic crosses the link the replicas' reductions use.
  costs.collective_slowdown = profile.degrees.back().collective_slowdown;
  costs.shared_link = true;  // the replicas are ranks of one tensor-parallel group
  price_expert_all_to_alls(profile, costs, program);
  return costs;
}

std::function<double(const schedule::Instruction&)> profiled_compute(const Profile& profile,
                                                                     const ops::Program& program,
                                                                     double sub_batch_rows,
                                                                     int tp) {
  return [&profile, &program, sub_batch_rows, tp](const schedule::Instruction& ins) {
    const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
    const DegreeProfile& d = degree_of(profile, shape.degree);
    const std::string kind = kind_at(program, ins.segment);
    const auto it = d.segments.find(kind);
    if (it == d.segments.end()) return 0.0;  // a reshard's epilogue: counted in attention's
    double factor = sub_batch_rows * shape.degree / tp / static_cast<double>(d.rows);
    // The experts take the busiest expert-parallel rank's time (Profile::expert_load_imbalance).
    if (kind == "experts")
      if (const auto busiest = profile.expert_load_imbalance.find(shape.layer);
          busiest != profile.expert_load_imbalance.end())
        factor *= busiest->second;
    return segment_seconds(it->second, ins) * factor;
  };
}

std::function<double(const schedule::Instruction&)> profiled_codec(
    const Profile& profile, const ops::Program& program,
    std::function<double(const schedule::Instruction&)> unmeasured) {
  if (profile.activation_codec.empty()) return unmeasured;
  return
      [&profile, &program, unmeasured = std::move(unmeasured)](const schedule::Instruction& ins) {
        const auto it = profile.activation_codec.find(ops::encoding_name(ins.encoding));
        if (it == profile.activation_codec.end()) return unmeasured ? unmeasured(ins) : 0.0;
        const double per_element = ins.op == schedule::Op::encode ? it->second.encode_s_per_element
                                                                  : it->second.decode_s_per_element;
        return per_element * ops::encodable_elements(program, ins.segment, ins.sets);
      };
}

Prediction predict_uniform(const Profile& profile, int degree, const schedule::ScheduleSpec& spec,
                           std::int64_t micro_batch, double overlap_slowdown) {
  return predict_uniform(profile, degree, spec, micro_batch, static_cast<int>(profile.model.layers),
                         overlap_slowdown);
}

Prediction predict_uniform(const Profile& profile, int degree, const schedule::ScheduleSpec& spec,
                           std::int64_t micro_batch, int layers, double overlap_slowdown) {
  const DegreeProfile& d = degree_of(profile, degree);
  // Rows of one segment instance on one replica.
  const double rows = static_cast<double>(micro_batch) * degree / profile.tp / spec.sub_batches;
  const ops::Program program = program_at(profile, degree, rows, layers);
  const schedule::Schedule schedule = training_schedule(program, spec);
  const double slowdown = overlap_slowdown >= 0 ? overlap_slowdown : d.overlap_slowdown;
  const sim::SimResult sim =
      sim::simulate(schedule, costs_at(profile, degree, rows, program, slowdown));
  Prediction p;
  p.step_seconds = sim.step_seconds;
  p.compute_seconds = sim.compute_seconds;
  p.exposed_comm_seconds = sim.exposed_comm_seconds;
  // Boundary buffers: the profiled set for `rows`, plus one port set per extra sub-batch.
  const double factor = rows / static_cast<double>(d.rows);
  const std::int64_t port = 4 * static_cast<std::int64_t>(program.segments[1].checkpoint_bytes);
  p.memory = state_memory(
      profile, d.parameter_bytes - (profile.model.layers - layers) * d.parameter_bytes_per_layer);
  p.memory.activations =
      scaled(d.static_activation_bytes, factor) + (spec.sub_batches - 1) * port +
      static_cast<std::int64_t>(schedule::peak_activation_bytes(program, schedule));
  return p;
}

namespace {

// The program of a plan with the segment shapes model::Model builds for GPT (model/model.h),
// set sizes scaled from the profile to each segment's rows.
struct PlanProgram {
  ops::Program program;
  std::vector<double> rows;  // per segment: sequences of one instance
  bool reshards = false;
};

PlanProgram plan_program(const Profile& profile, const std::vector<int>& degrees,
                         const std::vector<bool>& moe, double sub_batch_rows) {
  const int T = profile.tp;
  const auto L = static_cast<int>(degrees.size());
  const auto layer_degree = [&](int layer) {
    return layer < 0 || layer >= L ? T : degrees[static_cast<std::size_t>(layer)];
  };
  const auto rows_at = [&](int k) { return sub_batch_rows * k / T; };
  const auto shape_at = [&](int k, const std::string& kind, int l) {
    return segment_shape(degree_of(profile, k), rows_at(k), kind, l, L, profile.ep);
  };
  PlanProgram out;
  out.program.set_element_bytes = static_cast<std::size_t>(profile.element_bytes);
  const auto add = [&](ops::SegmentShape shape, double rows) {
    out.program.segments.push_back(std::move(shape));
    out.rows.push_back(rows);
  };
  const auto add_reshard = [&](int into_layer) {
    const int from = layer_degree(into_layer - 1), to = layer_degree(into_layer);
    if (from == to) return;
    ops::SegmentShape r;
    r.name = "reshard." + std::to_string(into_layer);
    r.has_forward_collective = from < to;
    r.has_backward_collective = from > to;
    r.backward_stages = from < to ? 1 : 2;
    r.forward_kind = r.backward_kind = ops::CollectiveKind::all_gather;
    r.collective_ranks = std::max(from, to) / std::min(from, to);
    r.degree = from;
    add(r, rows_at(from));
  };
  add(shape_at(T, "embedding", -1), rows_at(T));
  for (int l = 0; l < L; ++l) {
    add_reshard(l);
    add(shape_at(layer_degree(l), "attention", l), rows_at(layer_degree(l)));
    for (const std::string& kind : feed_forward_kinds(moe[static_cast<std::size_t>(l)]))
      add(shape_at(layer_degree(l), kind, l), rows_at(layer_degree(l)));
  }
  add_reshard(L);
  append_head(out.program, [&](const std::string& kind) { return shape_at(T, kind, -1); });
  out.rows.resize(out.program.segments.size(), rows_at(T));
  for (const ops::SegmentShape& shape : out.program.segments)
    out.reshards = out.reshards || shape.name.starts_with("reshard.");
  return out;
}

// Parameter bytes of this rank under a plan of degrees.size() layers (the profile's model may
// have more): the embeddings and ln_f at T, each layer at its degree.
std::int64_t plan_parameter_bytes(const Profile& profile, const std::vector<int>& degrees) {
  const DegreeProfile& full = degree_of(profile, profile.tp);
  std::int64_t bytes = full.parameter_bytes - profile.model.layers * full.parameter_bytes_per_layer;
  for (int k : degrees) bytes += degree_of(profile, k).parameter_bytes_per_layer;
  return bytes;
}

}  // namespace

void check_profiled_kinds(const Profile& profile, const ops::Program& program) {
  for (const ops::SegmentShape& shape : program.segments) {
    const std::string kind = segment_kind(shape.name);
    if (kind == "reshard" || kind == "stage_output") continue;  // priced by their collectives
    const DegreeProfile& d = degree_of(profile, shape.degree);
    const bool shard_at_one = profile.layout.sequence_parallel && shape.degree == 1;
    OASES_CHECK(d.segments.contains(kind),
                "the profile has no times for segment {} (kind \"{}\") at tensor-parallel "
                "degree {}; {}",
                shape.name, kind, shape.degree,
                shard_at_one ? "under sequence parallelism a group of one has no "
                               "sequence-parallel segments to measure: give every layer a "
                               "degree above 1 (parallel.plan)"
                             : fmt::format("it was measured with {}: re-run `oases profile` with "
                                           "this config",
                                           profile.layout.describe()));
  }
}

sim::CostModel profiled_costs(const Profile& profile, const ops::Program& program,
                              double sub_batch_rows, const std::vector<int>& layer_degrees,
                              double overlap_slowdown) {
  const int T = profile.tp;
  const auto L = static_cast<int>(layer_degrees.size());
  const DegreeProfile& full = degree_of(profile, T);
  sim::CostModel costs;
  costs.compute = profiled_compute(profile, program, sub_batch_rows, T);
  costs.codec = profiled_codec(profile, program, nullptr);
  costs.collective = [&profile, &program, sub_batch_rows](const schedule::Instruction& ins) {
    const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
    const std::string kind = segment_kind(shape.name);
    if (kind == "reshard") {
      // An all-gather from the smaller group's rows to the larger group's, forward where the
      // degree rises.
      const int to = shape.has_forward_collective ? shape.degree * shape.collective_ranks
                                                  : shape.degree / shape.collective_ranks;
      return profile.reshard_seconds(shape.degree, to);
    }
    const DegreeProfile& d = degree_of(profile, shape.degree);
    const auto it = d.collectives.find(
        kind + (ins.direction == schedule::Direction::forward ? ".fwd_s" : ".bwd_s"));
    const double factor = sub_batch_rows * shape.degree / profile.tp / static_cast<double>(d.rows);
    return it == d.collectives.end() ? 0.0 : it->second * factor;
  };
  costs.gather_sets = [&profile, &program](const schedule::Instruction& ins) {
    return checkpoint_gather_seconds(
        profile, program.segments[static_cast<std::size_t>(ins.segment)].degree);
  };
  // Bucket 1 + l: layer l's gradients over its replicas at its degree; bucket 0: the rest of
  // the parameters (the embeddings) over the replicas at T, at the same rate per byte.
  std::vector<double> reduce(static_cast<std::size_t>(L + 1), 0.0);
  if (full.parameter_bytes_per_layer > 0)
    reduce[0] = full.replica_reduce_per_layer_s *
                static_cast<double>(full.parameter_bytes -
                                    profile.model.layers * full.parameter_bytes_per_layer) /
                static_cast<double>(full.parameter_bytes_per_layer);
  for (int l = 0; l < L; ++l)
    reduce[static_cast<std::size_t>(l + 1)] =
        degree_of(profile, layer_degrees[static_cast<std::size_t>(l)]).replica_reduce_per_layer_s;
  costs.reduce_grads = [reduce](int bucket) {
    return bucket >= 0 && static_cast<std::size_t>(bucket) < reduce.size()
               ? reduce[static_cast<std::size_t>(bucket)]
               : 0.0;  // ln_f is negligible
  };
  // The optimizer's time follows the number of parameters it updates.
  costs.optimizer_step = full.optimizer_s *
                         static_cast<double>(plan_parameter_bytes(profile, layer_degrees)) /
                         static_cast<double>(std::max<std::int64_t>(1, full.parameter_bytes));
  // Measured on the whole group (degree T), the only one whose traffic crosses the link in the
  // profile; every collective of the plan (reshards and replica reductions too) uses that link.
  costs.overlap_slowdown = overlap_slowdown >= 0 ? overlap_slowdown : full.overlap_slowdown;
  costs.collective_slowdown = full.collective_slowdown;
  costs.shared_link = true;  // a layer's replicas are ranks of the tensor-parallel group
  price_expert_all_to_alls(profile, costs, program);
  return costs;
}

Prediction predict_plan(const Profile& profile, const std::vector<int>& degrees,
                        const schedule::ScheduleSpec& spec, std::int64_t micro_batch,
                        double overlap_slowdown) {
  return predict_plan(profile, degrees, model_moe_layers(profile, static_cast<int>(degrees.size())),
                      spec, micro_batch, overlap_slowdown);
}

Prediction predict_plan(const Profile& profile, const std::vector<int>& degrees,
                        const std::vector<bool>& moe, const schedule::ScheduleSpec& spec,
                        std::int64_t micro_batch, double overlap_slowdown) {
  const int T = profile.tp;
  OASES_CHECK(moe.size() == degrees.size(),
              "a plan of {} layer degrees with {} MoE-layer flags: give one flag per layer",
              degrees.size(), moe.size());
  const double sub_batch_rows = static_cast<double>(micro_batch) / spec.sub_batches;
  const PlanProgram plan = plan_program(profile, degrees, moe, sub_batch_rows);
  const ops::Program& program = plan.program;
  const DegreeProfile& full = degree_of(profile, T);
  const sim::CostModel costs =
      profiled_costs(profile, program, sub_batch_rows, degrees, overlap_slowdown);
  const std::int64_t parameter_bytes = plan_parameter_bytes(profile, degrees);

  const schedule::Schedule schedule = training_schedule(program, spec);
  const sim::SimResult sim = sim::simulate(schedule, costs);
  Prediction p;
  p.step_seconds = sim.step_seconds;
  p.compute_seconds = sim.compute_seconds;
  p.exposed_comm_seconds = sim.exposed_comm_seconds;
  // Boundary buffers and scratch as profiled for one sub-batch at T, one more port set per
  // extra sub-batch, and the reshard buffers when the plan has reshards.
  const double factor = sub_batch_rows / static_cast<double>(full.rows);
  const auto activation = static_cast<std::int64_t>(
      sub_batch_rows * static_cast<double>(profile.model.seq_len * profile.model.hidden) *
      static_cast<double>(profile.element_bytes));
  const bool reshards = plan.reshards;
  p.memory = state_memory(profile, parameter_bytes);
  p.memory.activations =
      scaled(full.static_activation_bytes, factor) + (spec.sub_batches - 1) * 4 * activation +
      (reshards ? spec.sub_batches * activation : 0) +
      static_cast<std::int64_t>(schedule::peak_activation_bytes(program, schedule));
  return p;
}

}  // namespace oases::planner
