#include "train/profiler.h"

#include "core/buffer.h"
#include "core/error.h"
#include "core/log.h"
#include "core/philox.h"
#include "core/timer.h"
#include "kernels/kernels.h"
#include "ops/activation_store.h"
#include "planner/planner.h"
#include "planner/profiler.h"
#include "train/engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace oases::train {
namespace {

using planner::median;

// How compute and communication slow each other down on these devices (every rank of the
// group calls it): a GEMM of the MLP's shape at tensor-parallel degree `degree` timed alone and
// while an all-reduce of one activation is in flight on `group`, and that all-reduce timed alone
// and while GEMMs run. The GEMM loop runs until the all-reduce completes, so the comparison
// covers the whole transfer.
struct OverlapSlowdown {
  double compute = 0;     // GEMM time under the all-reduce / alone - 1
  double collective = 0;  // all-reduce time under GEMMs / alone - 1
};

// How long an operation was on the wire, where the backend measures it (else `fallback`).
double wire_seconds(const comm::Work& work, double fallback) {
  const auto timing = work.timing();
  return timing ? std::chrono::duration<double>(timing->finished - timing->began).count()
                : fallback;
}

OverlapSlowdown measure_overlap_slowdown(comm::Communicator& group, const plan::RunConfig& c,
                                         int degree) {
  if (group.size() == 1) return {};
  const std::int64_t n = c.train.micro_batch * c.model.seq_len, C = c.model.hidden,
                     F = c.model.ffn_hidden / degree;
  std::vector<float> x(static_cast<std::size_t>(n * C), 0.5f),
      w(static_cast<std::size_t>(C * F), 0.01f), y(static_cast<std::size_t>(n * F));
  std::vector<float> activation(static_cast<std::size_t>(n * C), 1.0f);
  const auto one_gemm = [&] {
    kernels::linear_forward(Tensor::of(x.data(), {n, C}), Tensor::of(w.data(), {C, F}),
                            kernels::WeightLayout::in_out, Tensor(), Tensor::of(y.data(), {n, F}));
  };
  const auto all_reduce = [&] {
    return group.all_reduce_async(Tensor::of(activation.data(), {n * C}), comm::ReduceOp::sum);
  };
  one_gemm();
  all_reduce()->wait();  // connections up
  std::vector<double> alone, overlapped, reduce_alone, reduce_overlapped;
  for (int round = 0; round < 3; ++round) {
    group.barrier();
    for (int i = 0; i < 3; ++i) {
      const Stopwatch clock;
      one_gemm();
      alone.push_back(clock.seconds());
    }
    group.barrier();
    {
      const Stopwatch clock;
      auto work = all_reduce();
      work->wait();
      reduce_alone.push_back(wire_seconds(*work, clock.seconds()));
    }
    group.barrier();
    auto work = all_reduce();
    int gemms = 0;
    const Stopwatch clock;
    double reduced_at = 0;
    do {
      one_gemm();
      ++gemms;
      if (reduced_at == 0 && work->test()) reduced_at = clock.seconds();
    } while (reduced_at == 0);
    overlapped.push_back(clock.seconds() / gemms);
    work->wait();
    // Where the backend does not time it, completion is seen at a GEMM's end.
    reduce_overlapped.push_back(wire_seconds(*work, reduced_at));
  }
  return {std::max(0.0, median(overlapped) / median(alone) - 1.0),
          std::max(0.0, median(reduce_overlapped) / median(reduce_alone) - 1.0)};
}

// Fixed random tokens for the profile's steps (any will do: the compute does not depend on
// them, except an MoE router's choices, which the profile records).
struct Tokens {
  std::vector<std::int32_t> inputs, targets;
};
Tokens profile_tokens(const plan::RunConfig& c) {
  const auto tokens = static_cast<std::size_t>(c.train.micro_batch * c.model.seq_len);
  Tokens t{std::vector<std::int32_t>(tokens), std::vector<std::int32_t>(tokens)};
  const PhiloxKey key = philox_key(static_cast<std::uint64_t>(c.train.seed), fnv1a64("profile"));
  for (std::size_t i = 0; i < tokens; ++i) {
    const auto block = philox4x32({static_cast<std::uint32_t>(i), 0, 0, 0}, key);
    const auto vocab = static_cast<std::uint32_t>(c.model.vocab_size);
    t.inputs[i] = static_cast<std::int32_t>(block[0] % vocab);
    t.targets[i] = static_cast<std::int32_t>(block[1] % vocab);
  }
  return t;
}

// Seconds per element of compressing a kept set and bringing it back (Profile::ActivationCodec),
// per encoding: a block of normal values in the run's activation type encoded and decoded
// through an ActivationStore, whose buffers are reused after the first round as a run's are
// after its first step; the median of five rounds after that one.
std::map<std::string, planner::ActivationCodec> measure_activation_codec(DType dtype,
                                                                         std::uint64_t seed) {
  constexpr std::int64_t kElements = std::int64_t{1} << 22;  // a large layer's kept set
  constexpr int kRounds = 6;
  std::vector<float> values(static_cast<std::size_t>(kElements));
  const PhiloxKey key = philox_key(seed, fnv1a64("activation codec"));
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(
        normal_from_block(philox4x32({static_cast<std::uint32_t>(i), 0, 0, 0}, key)));
  const Tensor source(values.data(), DType::f32, {kElements});
  std::map<std::string, planner::ActivationCodec> out;
  for (const auto& [encoding, word] : ops::kActivationEncodingNames) {
    ops::ActivationStore store;
    const ops::ActivationKey set{0, 0, 0, ops::kInternals};
    std::vector<double> encode, decode;
    for (int round = 0; round < kRounds; ++round) {
      const Tensor block = store.acquire(set, dtype, kElements);
      if (dtype == DType::f32)
        kernels::copy(source, block);
      else
        kernels::convert(source, block);
      const Stopwatch encoding_time;
      store.encode(set, encoding);
      const double encoded = encoding_time.seconds();
      const Stopwatch decoding_time;
      store.decode(set);
      const double decoded = decoding_time.seconds();
      store.release(set);
      if (round == 0) continue;
      encode.push_back(encoded);
      decode.push_back(decoded);
    }
    const auto n = static_cast<double>(kElements);
    out[std::string(word)] = {median(encode) / n, median(decode) / n};
  }
  return out;
}

// The all-gather of a reshard between degrees a < b: every group of b ranks gathers one
// sub-batch's r_l from its b / a groups of degree a, all groups at once as in a training step.
void measure_reshards(planner::Profile& profile, const plan::RunConfig& config,
                      std::int64_t sub_batch_rows, const ProfileOptions& options,
                      const std::function<comm::Mesh(int tp, int dp)>& make_mesh) {
  const int T = profile.tp;
  if (T == 1) return;
  comm::Mesh mesh = make_mesh(T, 1);
  const std::int64_t row_floats = config.model.seq_len * config.model.hidden;
  for (int a = 1; a < T; a *= 2) {
    for (int b = 2 * a; b <= T; b *= 2) {
      comm::Communicator& group = mesh.tp_subgroup(b, a);
      const std::int64_t block = sub_batch_rows * a / T * row_floats;
      std::vector<float> rows(static_cast<std::size_t>(block * group.size()), 1.0f);
      std::vector<double> times;
      for (int s = 0; s < options.steps + 1; ++s) {
        mesh.tp_group().barrier();
        const Stopwatch clock;
        group.all_gather(Tensor::of(rows.data() + group.rank() * block, {block}),
                         Tensor::of(rows.data(), {block * group.size()}));
        if (s > 0) times.push_back(clock.seconds());  // the first warms the connections up
      }
      profile.reshards[planner::Profile::reshard_key(a, b)] = median(times);
      if (options.progress)
        log_info("reshard between degrees {} and {}: {:.2f} ms", a, b, 1e3 * median(times));
    }
  }
}

// The link between the ranks of the expert-parallel group (parallel.ep > 1): blocking
// all-to-alls of a small buffer and of one MoE dispatch buffer (`dispatch_elements`, what a
// sub-batch of the whole group sends), each per-peer time fitted as latency + block / bandwidth
// (sim::all_to_all_seconds' model). Every ep group measures at once, as in a training step.
planner::ExpertLink measure_expert_link(const plan::RunConfig& config, std::int64_t dispatch_elements,
                                        const ProfileOptions& options,
                                        const std::function<comm::Mesh(int tp, int dp)>& make_mesh) {
  const auto T = static_cast<int>(config.parallel.tp);
  const auto ep = static_cast<int>(config.parallel.ep);
  comm::Mesh mesh = make_mesh(T, ep);
  mesh.add_expert_groups(ep);
  comm::Communicator& group = mesh.ep_group();
  const std::int64_t small = 64 * ep;
  const std::int64_t large = std::max(dispatch_elements / ep * ep, 64 * small);
  // Median seconds per peer of an all-to-all of `elements` floats on each rank.
  const auto per_peer = [&](std::int64_t elements) {
    std::vector<float> send(static_cast<std::size_t>(elements), 1.0f), recv(send.size());
    std::vector<double> times;
    for (int s = 0; s < options.steps + 2; ++s) {
      mesh.world().barrier();
      const Stopwatch clock;
      group.all_to_all(Tensor::of(send.data(), {elements}), Tensor::of(recv.data(), {elements}));
      if (s > 0) times.push_back(clock.seconds());  // the first warms the connections up
    }
    return median(times) / (ep - 1);
  };
  const double t_small = per_peer(small), t_large = per_peer(large);
  const double block_small = static_cast<double>(small / ep * 4),
               block_large = static_cast<double>(large / ep * 4);
  planner::ExpertLink link;
  // A larger block that took no longer (noise on a fast link) leaves the latency unknown: the
  // large exchange's time is then all bandwidth.
  link.bytes_per_second = t_large > t_small ? (block_large - block_small) / (t_large - t_small)
                                            : block_large / std::max(t_large, 1e-9);
  link.latency_s = std::max(0.0, t_small - block_small / link.bytes_per_second);
  if (options.progress)
    log_info("expert-parallel link over {} ranks: {:.1f} MB/s, {:.1f} us per message "
             "(all-to-all of {} floats: {:.2f} ms)",
             ep, link.bytes_per_second / 1e6, 1e6 * link.latency_s, large,
             1e3 * t_large * (ep - 1));
  return link;
}

// Context parallelism's transfers (the ring's shifts, the all-to-all kind's exchanges) travel
// beside a step even in the measured engine (SegmentShape::beside_transfers), so the wire time
// it records holds the step's interference. Each segment kind's transfer is timed again alone
// here: a blocking transfer of the same kind and size over the context-parallel group, the
// median over `steps` after one that warms the connections up, recorded as the kind's
// collective time in that direction (the simulator adds the overlap's slowdown itself).
void time_context_parallel_transfers_alone(const model::Model& model, comm::Communicator& cp,
                                           int steps, planner::DegreeProfile& degree) {
  const std::size_t element = dtype_size(model.activation_dtype());
  std::map<std::string, double> alone;
  for (const ops::SegmentShape& shape : model.program().segments) {
    for (const bool forward : {true, false}) {
      const bool has = forward ? shape.has_forward_collective : shape.has_backward_collective;
      const ops::CollectiveKind kind = forward ? shape.forward_kind : shape.backward_kind;
      const bool transfer = kind == ops::CollectiveKind::shift ||
                            (kind == ops::CollectiveKind::all_to_all && shape.context_parallel_ranks > 0);
      if (!has || !transfer) continue;
      const std::string key = planner::segment_kind(shape.name) + (forward ? ".fwd_s" : ".bwd_s");
      if (alone.contains(key)) continue;
      const std::int64_t elements =
          forward ? shape.forward_collective_elements : shape.backward_collective_elements;
      Buffer send(static_cast<std::size_t>(elements) * element),
          recv(static_cast<std::size_t>(elements) * element);
      const Tensor in = send.tensor(model.activation_dtype(), {elements});
      const Tensor out = recv.tensor(model.activation_dtype(), {elements});
      kernels::zero(in);
      std::vector<double> times;
      for (int s = 0; s < steps + 1; ++s) {
        cp.barrier();
        const Stopwatch clock;
        if (kind == ops::CollectiveKind::shift) cp.shift_async(in, out, 1)->wait();
        else cp.all_to_all(in, out);
        if (s > 0) times.push_back(clock.seconds());
      }
      alone[key] = median(times);
    }
  }
  for (const auto& [key, seconds] : alone) degree.collectives[key] = seconds;
}

}  // namespace

planner::Profile profile_of_run(const plan::RunPlan& plan) {
  const plan::RunConfig& config = plan.config;
  const schedule::ScheduleSpec& spec = plan.schedule;
  const auto T = static_cast<int>(config.parallel.tp);
  OASES_CHECK((T & (T - 1)) == 0, "parallel.tp = {}: the planner's degrees are powers of two", T);
  planner::Profile profile;
  profile.model = config.model;
  profile.tp = T;
  profile.micro_batch = config.train.micro_batch;
  profile.sub_batches = spec.sub_batches;
  profile.element_bytes = static_cast<std::int64_t>(dtype_size(plan.dtypes.compute));
  profile.precision = config.train.precision;
  profile.zero = static_cast<int>(config.parallel.zero);
  profile.offload = config.parallel.offload;
  profile.ep = static_cast<int>(config.parallel.ep);
  profile.layout = plan.profiled_layout();
  const std::int64_t sub_batch_rows = config.train.micro_batch / spec.sub_batches;
  for (int k = 1; k <= T; k *= 2) {
    // A degree-k replica handles k / T of each sub-batch.
    OASES_CHECK(sub_batch_rows * k % T == 0,
                "a sub-batch of {} sequences does not split over {} replicas of degree {}: make "
                "train.micro_batch / parallel.sub_batches a multiple of parallel.tp = {}",
                sub_batch_rows, T / k, k, T);
    config.model.validate_tensor_parallel(k);
  }
  return profile;
}

namespace {

// One degree's engines: the measured one (fine-grained, blocking collectives, one sub-batch's
// share of rows) and, at the whole group's degree under a schedule that overlaps its
// collectives, the run's own schedule stepping beside it.
struct DegreeEngines {
  plan::RunConfig measured_config;
  std::unique_ptr<TrainingEngine> measured;
  Tokens measured_tokens;
  std::unique_ptr<TrainingEngine> overlapped;
  Tokens overlapped_tokens;
};

DegreeEngines degree_engines(const plan::RunPlan& run, comm::Mesh& mesh, int k,
                             std::int64_t rows) {
  const plan::RunConfig& config = run.config;
  DegreeEngines e;
  plan::RunConfig& c = e.measured_config;
  c = config;
  c.parallel = plan::ParallelConfig{};
  c.parallel.tp = k;
  // The layers' segments are those of the run's layout (planner::ProfiledLayout): sequence
  // parallelism where the group has more than one rank, the run's context parallelism.
  c.parallel.sequence_parallel = config.parallel.sequence_parallel && k > 1;
  c.parallel.cp = config.parallel.cp;
  c.parallel.cp_kind = config.parallel.cp_kind;
  // The memory figures (and the optimizer's time) are measured under the run's ZeRO stage and
  // offload. This engine has no data-parallel ranks, so ZeRO shards nothing: the figures are
  // those of a run at dp = 1, as parallel.plan = "auto" runs.
  c.parallel.zero = config.parallel.zero;
  c.parallel.offload = config.parallel.offload;
  c.parallel.offload_dir = config.parallel.offload_dir;
  c.parallel.schedule = "fine-grained";
  c.train.micro_batch = c.train.global_batch = rows;
  c.checkpoint = {};
  c.log = {};
  ParallelGroups groups{&mesh.tp_group(), nullptr, {}, {}};
  if (mesh.cp_size() > 1) {
    // The engine is one replica over its context-parallel ranks (dp = 1): those ranks sum
    // its gradients.
    groups.cp = &mesh.cp_group();
    groups.dp = &mesh.cp_group();
  }
  e.measured = std::make_unique<TrainingEngine>(c, groups);
  e.measured_tokens = profile_tokens(c);
  // At the whole group's degree, a schedule that overlaps compute with its collectives runs its
  // own steps too, one after each timed blocking step (so that both see the shared host alike):
  // they measure how compute and communication slow each other in training steps rather than
  // in a synthetic loop (planner::OverlapCollector).
  // Context parallelism's transfers overlap compute even where the tensor-parallel group is
  // one rank.
  const int T = run.mesh.tp;
  if (k == T && (T > 1 || run.mesh.cp > 1) && schedule::overlaps_collectives(run.schedule.kind)) {
    plan::RunConfig o = c;
    o.parallel.schedule = config.parallel.schedule;
    o.parallel.recompute = config.parallel.recompute;
    o.parallel.recompute_every = config.parallel.recompute_every;
    o.parallel.sub_batches = config.parallel.sub_batches;
    o.train.micro_batch = o.train.global_batch = config.train.micro_batch;
    e.overlapped = std::make_unique<TrainingEngine>(o, groups);
    e.overlapped_tokens = profile_tokens(o);
  }
  return e;
}

// Warm-up and timed steps; the measured engine's records go to `timings`, the overlapped one's
// to `overlap`. Returns each MoE layer's kept assignments per expert over the timed steps.
std::map<int, std::vector<double>> run_steps(DegreeEngines& e, const ProfileOptions& options,
                                             planner::TimingCollector& timings,
                                             planner::OverlapCollector& overlap) {
  const auto step = [&](TrainingEngine& engine, const Tokens& tokens, int s) {
    engine.train_step(s, tokens.inputs.data(), tokens.targets.data());
  };
  for (int s = 0; s < options.warmup_steps; ++s) {
    step(*e.measured, e.measured_tokens, s);
    if (e.overlapped) step(*e.overlapped, e.overlapped_tokens, s);
  }
  e.measured->set_listener(&timings);
  if (e.overlapped) e.overlapped->set_listener(&overlap);
  std::map<int, std::vector<double>> routed;
  for (int s = 0; s < options.steps; ++s) {
    step(*e.measured, e.measured_tokens, options.warmup_steps + s);
    if (e.overlapped) {
      step(*e.overlapped, e.overlapped_tokens, options.warmup_steps + s);
      overlap.end_step();
    }
    // The stats restart with every step.
    const auto& stats = e.measured->model().moe_stats();
    for (std::size_t layer = 0; layer < stats.size(); ++layer) {
      const std::vector<double>& counts = stats[layer].tokens_per_expert;
      if (counts.empty()) continue;
      auto& sum = routed[static_cast<int>(layer)];
      sum.resize(counts.size(), 0.0);
      for (std::size_t e_index = 0; e_index < counts.size(); ++e_index) sum[e_index] += counts[e_index];
    }
  }
  e.measured->set_listener(nullptr);
  if (e.overlapped) e.overlapped->set_listener(nullptr);
  return routed;
}

// Per parameter byte, what the engine holds of each kind, from the same figures the start-up
// line and the metrics give (planner::Profile::param_bytes_ratio, ...). What is offloaded is the
// optimizer's state and, with "optimizer+params", the master weights: it comes off the
// optimizer's state first and the rest off the parameters.
void record_memory(TrainingEngine& engine, planner::Profile& profile, planner::DegreeProfile& degree) {
  const auto element = static_cast<std::int64_t>(dtype_size(engine.model().dtype()));
  const auto& layer0 = engine.model().layout().groups().at(1);  // the first layer's parameters
  degree.parameter_bytes_per_layer = (layer0.second - layer0.first) * element;
  degree.parameter_bytes = engine.model().param_count() * element;
  const planner::MemoryBytes resident = planner::resident_memory(engine.memory_figures());
  const double parameter_bytes = static_cast<double>(
      std::max<std::int64_t>(1, engine.model().param_count()) * element);
  profile.param_bytes_ratio = static_cast<double>(resident.params) / parameter_bytes;
  profile.grad_bytes_ratio = static_cast<double>(resident.grads) / parameter_bytes;
  profile.optimizer_bytes_ratio = static_cast<double>(resident.optimizer) / parameter_bytes;
  degree.static_activation_bytes =
      static_cast<std::int64_t>(engine.model().static_activation_bytes());
}

// The degree's overlap slowdowns: from the traced steps of the overlapped schedule where they
// measured something, else from a GEMM loop under an all-reduce over `beside`.
void record_slowdowns(const DegreeEngines& e, comm::Communicator& beside, int k,
                      const plan::RunPlan& run, const ProfileOptions& options,
                      planner::OverlapCollector& overlap, planner::DegreeProfile& degree) {
  // The GEMM loop runs even where the traced steps will give the slowdowns: it is collective,
  // and each rank decides from its own trace whether that measured anything.
  const OverlapSlowdown slowdown = measure_overlap_slowdown(beside, e.measured_config, k);
  degree.overlap_slowdown = slowdown.compute;
  degree.collective_slowdown = slowdown.collective;
  if (!e.overlapped) return;
  const planner::OverlapCollector::Estimate traced = overlap.estimate(degree);
  if (traced.compute_slowdown) degree.overlap_slowdown = *traced.compute_slowdown;
  if (traced.collective_slowdown) degree.collective_slowdown = *traced.collective_slowdown;
  if (options.progress)
    log_info("degree {}: under the {} schedule, {:.0f}% of compute ran with a collective on "
             "the wire and {:.0f}% of the collectives' time beside compute; slowdowns {:.3f} "
             "(compute{}) and {:.3f} (collectives{})",
             k, schedule::name(run.schedule.kind), 100 * traced.compute_share_in_flight,
             100 * traced.collective_share_under_compute, degree.overlap_slowdown,
             traced.compute_slowdown ? ", traced" : ", synthetic loop", degree.collective_slowdown,
             traced.collective_slowdown ? ", traced" : ", synthetic loop");
}

// Replicas of a layer sum its gradients: time that over the replica group. At degree 1 the
// same all-reduce also describes the link a data-parallel run's reductions cross
// (Profile::replica_link); with tp = 1 it is timed over the ranks beside the group.
void record_replica_reduction(comm::Mesh& mesh, comm::Communicator& beside, int k, int steps,
                              std::int64_t element, planner::Profile& profile,
                              planner::DegreeProfile& degree) {
  comm::Communicator& replicas = mesh.dp_group();
  comm::Communicator* reducing = replicas.size() > 1          ? &replicas
                                 : k == 1 && beside.size() > 1 ? &beside
                                                               : nullptr;
  if (reducing == nullptr) return;
  std::vector<float> grads(static_cast<std::size_t>(degree.parameter_bytes_per_layer / element), 1.0f);
  std::vector<double> times;
  for (int s = 0; s < steps + 1; ++s) {
    reducing->barrier();
    const Stopwatch clock;
    reducing->all_reduce(Tensor::of(grads.data(), {static_cast<std::int64_t>(grads.size())}));
    if (s > 0) times.push_back(clock.seconds());  // the first warms the connections up
  }
  if (reducing == &replicas) degree.replica_reduce_per_layer_s = median(times);
  if (k == 1)
    profile.replica_link = {static_cast<std::int64_t>(grads.size() * sizeof(float)),
                            reducing->size(), median(times)};
}

// Degree k's measurements: its segments and collectives timed, its memory, slowdowns and
// replica reduction.
planner::DegreeProfile profile_degree(const plan::RunPlan& run, const ProfileOptions& options,
                                      comm::Mesh& mesh, int k, std::int64_t rows,
                                      planner::Profile& profile) {
  DegreeEngines e = degree_engines(run, mesh, k, rows);
  planner::TimingCollector timings;
  planner::OverlapCollector overlap;
  const std::map<int, std::vector<double>> routed = run_steps(e, options, timings, overlap);
  // The routing of the most rows (the whole group's) stands for the run's.
  if (k == run.mesh.tp && run.mesh.ep > 1)
    for (const auto& [layer, counts] : routed)
      profile.expert_load_imbalance[layer] = planner::expert_load_imbalance(counts, run.mesh.ep);
  planner::DegreeProfile degree;
  degree.degree = k;
  degree.rows = rows;
  timings.fill(degree);
  if (mesh.cp_size() > 1)
    time_context_parallel_transfers_alone(e.measured->model(), mesh.cp_group(), options.steps,
                                          degree);
  record_memory(*e.measured, profile, degree);
  // A group of one rank has no tensor-parallel link, but its compute still shares the device
  // with reductions over the ranks beside it: its replicas at this degree (dp group), or with
  // tp 1 the copies of the group started beside it (the mesh's third axis). Measured over
  // those, as a data-parallel run's gradient all-reduces would run.
  comm::Communicator& beside = mesh.tp_group().size() > 1   ? mesh.tp_group()
                               : mesh.dp_group().size() > 1 ? mesh.dp_group()
                                                            : mesh.pp_group();
  record_slowdowns(e, beside, k, run, options, overlap, degree);
  record_replica_reduction(mesh, beside, k, options.steps,
                           static_cast<std::int64_t>(dtype_size(e.measured->model().dtype())),
                           profile, degree);
  record_segment_shapes(e.measured->model(), degree);
  if (options.progress)
    log_info(
        "degree {}: {} sequences per replica; attention forward {:.1f} ms, mlp forward {:.1f} ms",
        k, degree.rows, 1e3 * degree.segments["attention"].forward_s,
        1e3 * degree.segments["mlp"].forward_s);
  return degree;
}

}  // namespace

void record_segment_shapes(const model::Model& model, planner::DegreeProfile& degree) {
  for (const ops::SegmentShape& shape : model.program().segments) {
    const std::string kind = planner::segment_kind(shape.name);
    auto& sets = degree.activation_bytes[kind];
    sets["checkpoint"] = static_cast<std::int64_t>(shape.checkpoint_bytes);
    sets["internals"] = static_cast<std::int64_t>(shape.internals_bytes);
    sets["core"] = static_cast<std::int64_t>(shape.core_bytes);
    if (std::find(std::begin(planner::kMoeKinds), std::end(planner::kMoeKinds), kind) !=
        std::end(planner::kMoeKinds)) {
      degree.collective_elements[kind + ".fwd"] = shape.forward_collective_elements;
      degree.collective_elements[kind + ".bwd"] = shape.backward_collective_elements;
    }
  }
}

planner::Profile run_profile(const plan::RunConfig& config, const ProfileOptions& options,
                             const std::function<comm::Mesh(int tp, int dp)>& make_mesh) {
  const plan::RunPlan run = plan::make_run_plan(config);
  const int T = run.mesh.tp, ep = run.mesh.ep;
  OASES_CHECK((config.parallel.dp == 1 || config.parallel.dp == ep) && config.parallel.pp == 1,
              "oases profile measures one tensor-parallel group, and with parallel.ep > 1 the "
              "link of one expert-parallel group: set parallel.pp = 1 and parallel.dp = 1 or "
              "parallel.dp = parallel.ep (found dp = {}, ep = {}, pp = {})",
              config.parallel.dp, ep, config.parallel.pp);
  OASES_CHECK(options.steps >= 1, "--steps = {} must be at least 1", options.steps);
  OASES_CHECK(options.warmup_steps >= 0, "warm-up steps = {} must be >= 0", options.warmup_steps);
  planner::Profile profile = profile_of_run(run);
  const std::int64_t sub_batch_rows = config.train.micro_batch / run.schedule.sub_batches;
  for (int k = 1; k <= T; k *= 2) {
    comm::Mesh mesh = make_mesh(k, T / k);
    // A degree-k replica handles k / T of each sub-batch.
    profile.degrees.push_back(
        profile_degree(run, options, mesh, k, sub_batch_rows * k / T, profile));
  }
  measure_reshards(profile, config, sub_batch_rows, options, make_mesh);
  profile.activation_codec =
      measure_activation_codec(run.dtypes.compute, static_cast<std::uint64_t>(config.train.seed));
  for (const auto& [word, codec] : profile.activation_codec)
    log_info("activation compression {}: encode {:.2f} ns, decode {:.2f} ns per element", word,
             1e9 * codec.encode_s_per_element, 1e9 * codec.decode_s_per_element);
  if (ep > 1) {
    // A sub-batch's dispatch buffer at the whole group's degree: what the run's all-to-alls
    // move per instance.
    const planner::DegreeProfile& top = profile.degrees.back();
    const auto it = top.collective_elements.find("moe_dispatch.fwd");
    OASES_ASSERT(it != top.collective_elements.end(), "parallel.ep = {} without MoE segments", ep);
    profile.expert_link = measure_expert_link(config, it->second, options, make_mesh);
  }
  return profile;
}

namespace {

// "key=value" lines of a joint plan's settings, and back: what rank 0 tells the others.
std::string settings_text(const std::vector<std::pair<std::string, std::string>>& settings) {
  std::string text;
  for (const auto& [key, value] : settings) text += key + "=" + value + "\n";
  return text;
}
std::vector<std::string> settings_overrides(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Rank 0's text on every rank of `group`.
std::string broadcast_text(comm::Communicator& group, const std::string& text) {
  std::int64_t size = static_cast<std::int64_t>(text.size());
  group.broadcast(Tensor::of(&size, {1}), 0);
  std::vector<std::int64_t> chars(static_cast<std::size_t>(size));
  for (std::size_t i = 0; i < text.size() && group.rank() == 0; ++i)
    chars[i] = static_cast<unsigned char>(text[i]);
  if (size > 0) group.broadcast(Tensor::of(chars.data(), {size}), 0);
  std::string out(static_cast<std::size_t>(size), ' ');
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(chars[i]);
  return out;
}

}  // namespace

plan::RunConfig plan_automatically(const plan::RunConfig& config, const ProfileOptions& options,
                                   const std::function<comm::Mesh(int tp, int dp)>& make_mesh,
                                   const std::string& plan_path, const PredictorOf& own_program,
                                   const JointSearch& joint) {
  OASES_ASSERT(plan::parse_settings(config).plan == plan::LayerPlanSource::automatic,
               "plan_automatically for parallel.plan = \"{}\"", config.parallel.plan);
  OASES_CHECK(config.parallel.dp == 1 && config.parallel.pp == 1,
              "parallel.plan = \"auto\" profiles one tensor-parallel group: set parallel.dp = 1 "
              "and parallel.pp = 1 (found dp = {}, pp = {}), or run `oases profile` and `oases "
              "plan` and pass the plan file as parallel.plan",
              config.parallel.dp, config.parallel.pp);
  plan::RunConfig planned = config;
  const auto T = static_cast<int>(config.parallel.tp);
  if (T == 1) {
    planned.parallel.plan = "uniform";  // one rank: every layer at degree 1
    return planned;
  }
  if (options.progress) log_info("parallel.plan = \"auto\": profiling every degree up to {}", T);
  const planner::Profile profile = run_profile(config, options, make_mesh);
  comm::Mesh mesh = make_mesh(T, 1);
  // Every rank follows world rank 0's plan (with context parallelism the tensor-parallel groups
  // of the cp ranks profile apart).
  comm::Communicator& group = mesh.world();
  // The joint search's settings first (rank 0 searches, the others apply what it found).
  std::optional<planner::Plan> joint_plan;
  std::string settings;
  if (joint && group.rank() == 0) {
    try {
      joint_plan = joint(config, profile);
      settings = settings_text(joint_plan->settings);
    } catch (const UserError& e) {
      if (options.progress)
        log_info("parallel.plan = \"auto\": the joint search found nothing that fits ({}); "
                 "planning the degrees of the config as given",
                 e.what());
    }
  }
  if (joint) settings = broadcast_text(group, settings);
  plan::RunConfig chosen = config;
  if (!settings.empty()) {
    chosen = plan::parse_run_config(plan::to_toml(config), "the joint plan",
                                    settings_overrides(settings));
    chosen.parallel.plan = "auto";
  }
  // Each layer's degree, where every rank stays in one tensor-parallel group.
  if (chosen.parallel.tp != T || chosen.parallel.cp != config.parallel.cp) {
    chosen.parallel.plan = "uniform";
    if (group.rank() == 0 && joint_plan && !plan_path.empty())
      planner::write_plan(*joint_plan, static_cast<int>(chosen.parallel.tp), plan_path);
    if (group.rank() == 0 && joint_plan && options.progress)
      log_info("planned: {}", plan_path.empty() ? std::string() : "wrote " + plan_path);
    return chosen;
  }
  const schedule::ScheduleSpec step = plan::make_run_plan(chosen).schedule;  // of one step
  // Rank 0 plans from its profile; a plan that cannot fit is an error every rank reports.
  std::vector<std::int64_t> degrees(static_cast<std::size_t>(config.model.layers), 0);
  std::string error;
  if (group.rank() == 0) {
    try {
      const bool moe_at_one = config.model.has_moe() && config.parallel.expert_tp == 1;
      const bool plain = profile.layout.plain();
      OASES_CHECK(plain || own_program,
                  "parallel.plan = \"auto\" with {}: this engine was started without the "
                  "prediction of the run's own program; run `oases profile` and `oases plan`",
                  profile.layout.describe());
      const planner::PlanReport report =
          plain ? planner::make_plan(profile, step, chosen.train.micro_batch,
                                     chosen.parallel.memory_limit, moe_at_one)
                : planner::make_plan(profile, step, chosen.parallel.memory_limit, moe_at_one,
                                     own_program(profile));
      std::copy(report.chosen.degrees.begin(), report.chosen.degrees.end(), degrees.begin());
      planner::Plan written = report.chosen;
      if (joint_plan) {
        written.settings = joint_plan->settings;
        written.report_json = joint_plan->report_json;
      }
      if (!plan_path.empty()) planner::write_plan(written, T, plan_path);
      if (options.progress)
        log_info("planned:\n{}{}", planner::format_plan_report(report, step,
                                                               chosen.parallel.memory_limit),
                 plan_path.empty() ? std::string() : "wrote " + plan_path);
    } catch (const UserError& e) {
      if (joint_plan) {
        // The joint search's simulation found its choice fits with every layer at degree T,
        // where the degree planner's own figures find no mix of degrees that does.
        std::ranges::fill(degrees, T);
        if (!plan_path.empty()) planner::write_plan(*joint_plan, T, plan_path);
        if (options.progress)
          log_info("planned: every layer at degree {}, as the joint search chose ({}){}", T,
                   e.what(), plan_path.empty() ? std::string() : "; wrote " + plan_path);
      } else {
        error = e.what();
      }
    }
  }
  group.broadcast(Tensor::of(degrees.data(), {static_cast<std::int64_t>(degrees.size())}), 0);
  OASES_CHECK(degrees.front() > 0, "parallel.plan = \"auto\": {}",
              group.rank() == 0 ? error : std::string("no plan fits (see rank 0)"));
  planned = chosen;
  planned.parallel.plan = fmt::format("{}", fmt::join(degrees, ","));
  return planned;
}

}  // namespace oases::train
