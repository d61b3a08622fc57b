#include "planner/cost_model.h"

#include "core/error.h"

#include <cmath>
#include <string>

namespace oases::planner {
namespace {

const DegreeProfile& degree_of(const Profile& profile, int degree) {
  const DegreeProfile* d = profile.at_degree(degree);
  OASES_CHECK(d != nullptr, "the profile has no measurements at tensor-parallel degree {}", degree);
  return *d;
}

// Segment kinds in program order: embedding, (attention, mlp) per layer, head.
std::string kind_at(const ops::Program& program, int segment) {
  const std::string& name = program.segments[static_cast<std::size_t>(segment)].name;
  return name.substr(0, name.find('.'));
}

std::int64_t scaled(std::int64_t bytes, double factor) {
  return static_cast<std::int64_t>(std::llround(static_cast<double>(bytes) * factor));
}

}  // namespace

ops::Program program_at(const Profile& profile, int degree, double rows) {
  return program_at(profile, degree, rows, static_cast<int>(profile.model.layers));
}

ops::Program program_at(const Profile& profile, int degree, double rows, int layers) {
  const DegreeProfile& d = degree_of(profile, degree);
  const double factor = rows / static_cast<double>(d.rows);
  const auto bytes = [&](const std::string& kind, const std::string& set) -> std::size_t {
    const auto k = d.activation_bytes.find(kind);
    if (k == d.activation_bytes.end()) return 0;
    const auto s = k->second.find(set);
    return s == k->second.end() ? 0 : static_cast<std::size_t>(scaled(s->second, factor));
  };
  ops::Program program;
  ops::SegmentShape embedding{"embedding", true, false, 1};
  embedding.ready_bucket = 0;
  program.segments.push_back(embedding);
  for (int l = 0; l < layers; ++l) {
    for (const std::string kind : {"attention", "mlp"}) {
      ops::SegmentShape s{kind + "." + std::to_string(l), true, true, 2};
      s.sets = ops::kCheckpoint | ops::kInternals | (kind == "attention" ? ops::kCore : 0);
      s.checkpoint_bytes = bytes(kind, "checkpoint");
      s.internals_bytes = bytes(kind, "internals");
      s.core_bytes = bytes(kind, "core");
      s.layer = l;
      s.recomputable = true;
      if (kind == "attention") s.ready_bucket = 1 + l;
      program.segments.push_back(s);
    }
  }
  ops::SegmentShape head{"head", false, true, 2};
  head.sets = ops::kInternals;
  head.internals_bytes = bytes("head", "internals");
  head.ready_bucket = layers + 1;
  program.segments.push_back(head);
  return program;
}

sim::CostModel costs_at(const Profile& profile, int degree, double rows,
                        const ops::Program& program, double overlap_slowdown) {
  const DegreeProfile& d = degree_of(profile, degree);
  const double factor = rows / static_cast<double>(d.rows);
  sim::CostModel costs;
  costs.compute = [&program, d, factor](const schedule::Instruction& ins) {
    const auto it = d.segments.find(kind_at(program, ins.segment));
    if (it == d.segments.end()) return 0.0;
    const SegmentTimes& t = it->second;
    switch (ins.op) {
      case schedule::Op::forward:
        return t.forward_s * factor;
      case schedule::Op::recompute:
        // Whole-layer recomputation also reruns the output GEMM and, for the MLP half, the
        // epilogue: a forward pass; the others regenerate what fine-grained recomputation does.
        return (ins.sets & ops::kOutput ? t.forward_s : t.recompute_s) * factor;
      case schedule::Op::backward:
        return (ins.stage == 0 ? t.backward0_s : t.backward1_s) * factor;
      default:
        return 0.0;
    }
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
  costs.overlap_slowdown = overlap_slowdown;
  return costs;
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
  const schedule::Schedule schedule = schedule::generate(program, spec);
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
  p.activation_bytes =
      scaled(d.static_activation_bytes, factor) + (spec.sub_batches - 1) * port +
      static_cast<std::int64_t>(schedule::peak_activation_bytes(program, schedule));
  p.state_bytes =
      4 * (d.parameter_bytes - (profile.model.layers - layers) * d.parameter_bytes_per_layer);
  return p;
}

}  // namespace oases::planner
