// Profile: measured costs of one model's segments and collectives at each candidate
// tensor-parallel degree, the planner's input. Written by `oases profile` as JSON:
//
//   {"format": "oases-profile", "version": 4,
//    "model": {"arch": "gpt", "layers": 4, "hidden": 1024, "heads": 16, "kv_heads": 16,
//              "ffn_hidden": 4096, "vocab_size": 256, "seq_len": 256,
//              "moe_every": 2, "experts": 8, "moe_gate": "gshard", "moe_top_k": 0,
//              "capacity_factor": 1.25, "eval_capacity_factor": 0, "moe_group_size": 0,
//              "moe_ffn_hidden": 0},  (the moe_* keys only for a model with MoE layers)
//    "tp": 2, "micro_batch": 4, "sub_batches": 2,
//    "element_bytes": 4, "optimizer_state_ratio": 2,
//    "param_bytes_ratio": 1, "grad_bytes_ratio": 1, "optimizer_bytes_ratio": 2,
//    "precision": "fp32", "zero": 0, "offload": "none",
//    "degrees": [
//      {"degree": 1, "rows": 1,
//       "segments": {"attention": {"forward_s": .., "recompute_s": .., "backward0_s": ..,
//                                  "backward1_s": ..}, "mlp": {..}, "embedding": {..},
//                    "head": {..}, "head_softmax": {..}, "head_loss": {..}},
//       "collectives": {"attention.fwd_s": .., "attention.bwd_s": .., "mlp.fwd_s": ..,
//                       "mlp.bwd_s": .., "embedding.fwd_s": .., "head.fwd_s": ..,
//                       "head_softmax.fwd_s": .., "head.bwd_s": .., ...},
//       "optimizer_s": .., "parameter_bytes": .., "parameter_bytes_per_layer": ..,
//       "replica_reduce_per_layer_s": .., "overlap_slowdown": .., "collective_slowdown": ..,
//       "activation_bytes": {"attention":
//       {"checkpoint": ..,
//                       "internals": .., "core": ..}, ...}},
//       "static_activation_bytes": ..,
//       "collective_elements": {"moe_dispatch.fwd": .., "experts.fwd": .., "experts.bwd": ..,
//                               "moe_combine.fwd": .., "moe_combine.bwd": .., ...}},
//      ...],
//    "reshards": {"1-2": .., "1-4": .., "2-4": ..},
//    "replica_link": {"bytes": .., "ranks": 2, "seconds": ..},  (optional: ReplicaLink)
//    "activation_codec": {"bf16": {"encode_s_per_element": .., "decode_s_per_element": ..},
//                         "fp8": {..}},  (optional: ActivationCodec, by encoding word)
//    "ep": 2, "expert_link": {"bytes_per_second": .., "latency_s": ..},
//    "expert_load_imbalance": {"1": .., "3": .., ...},
//    "sequence_parallel": true, "cp": 2, "cp_kind": "ring"}  (ProfiledLayout; absent: none)
//
// Mixture-of-experts models: an MoE layer runs as three segments in place of the MLP
// (ops/layer_segments.h), whose kinds "moe_dispatch", "experts" and "moe_combine" are measured
// like the others, with their collectives and the elements each collective moves
// ("collective_elements", at `rows`; they scale with the rows, as the dispatch groups do).
// Segments are measured at ep = 1 (every expert local: the experts segment computes the same
// slots as an expert-parallel rank, which gets E / ep experts' slots from ep ranks), so the
// all-to-alls there move nothing over a wire. When the run splits experts over ep > 1 ranks
// (parallel.ep), `oases profile` also measures the link between those ranks: blocking
// all-to-alls of two sizes over the expert-parallel group, fitted as
// (ep - 1) x (latency + block / bandwidth) (sim::all_to_all_seconds), which prices every
// all-to-all of the plan by its per-peer volume. "ep" and "expert_link" are absent from dense
// profiles and from those measured at ep = 1.
// Times are medians over repeated steps, in seconds, per sub-batch instance of a segment (one
// layer's segment, on `rows` sequences: a degree-k replica's share of a sub-batch, i.e.
// micro_batch / sub_batches * k / tp). Collectives are timed alone (blocking), so they are
// the wire time the cost model overlaps with compute. Transformer layers are alike, so each
// segment kind is measured once per degree (the median over layers). A reshard "a-b" (a < b)
// is the all-gather that moves one sub-batch's r_l from the rows of degree-a groups to those of
// a degree-b group (forward where the degree rises, backward where it falls), timed alone on
// the whole tensor-parallel group.
//
// The per-kind memory ratios and the settings they were measured under (precision, zero,
// offload) are optional on read: a profile without them reads as parameters 1, gradients 1 and
// optimizer optimizer_state_ratio, and as measured under unknown settings.
#pragma once

#include "model/config.h"
#include "ops/context.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace oases::planner {

struct SegmentTimes {
  double forward_s = 0, recompute_s = 0, backward0_s = 0, backward1_s = 0;
  bool operator==(const SegmentTimes&) const = default;
};

struct DegreeProfile {
  int degree = 1;
  std::int64_t rows = 0;
  std::map<std::string, SegmentTimes> segments;  // by kind: embedding, attention, mlp, head
  std::map<std::string, double> collectives;     // "<kind>.fwd_s", "<kind>.bwd_s", ...
  double optimizer_s = 0;                        // gradient clipping + AdamW, whole model
  std::int64_t parameter_bytes = 0;              // this rank's shard of the whole model
  std::int64_t parameter_bytes_per_layer = 0;    // one transformer layer's shard
  // Seconds to sum one transformer layer's gradients over the tp / degree replicas (0 for one).
  double replica_reduce_per_layer_s = 0;
  // How much slower compute runs while a collective of this group is in flight (0.1: 10%);
  // on CPUs the progress thread and the network stack share the cores. At the whole group's
  // degree under a schedule that overlaps its collectives (cross-pass, oases, ...), measured
  // from that schedule's own training steps (planner::OverlapCollector) where enough of them
  // overlapped; otherwise from a GEMM loop under an all-reduce of one activation. At degree 1
  // (a group of one), over the ranks beside it (its replicas, or the copies of the group a
  // launcher ran beside it); 0 where there are none.
  double overlap_slowdown = 0;
  // How much longer a collective of this group takes while compute runs (0.2: 20%): on CPUs
  // the compute threads take the cores the network stack needs. Measured as overlap_slowdown.
  double collective_slowdown = 0;
  std::map<std::string, std::map<std::string, std::int64_t>> activation_bytes;  // kind -> set
  // Boundary buffers and scratch of one sub-batch of `rows` sequences, allocated once.
  std::int64_t static_activation_bytes = 0;
  // Elements of the MoE segments' collective buffers at `rows`, by "<kind>.fwd" and
  // "<kind>.bwd" (ops::SegmentShape::forward_collective_elements, ...); empty for dense models.
  std::map<std::string, std::int64_t> collective_elements;
  bool operator==(const DegreeProfile&) const = default;
};

// The link between the ranks of an expert-parallel group, as sim::Link (bandwidth each way and
// latency per message); bytes_per_second 0: not measured.
struct ExpertLink {
  double bytes_per_second = 0;
  double latency_s = 0;
  bool operator==(const ExpertLink&) const = default;
};

// A blocking all-reduce between the ranks a data-parallel run's gradient reductions cross on
// the profiled machine: `bytes` per rank (one transformer layer's gradients at degree 1) over
// `ranks` ranks took `seconds`. ranks 0: not measured.
struct ReplicaLink {
  std::int64_t bytes = 0;
  int ranks = 0;
  double seconds = 0;
  bool operator==(const ReplicaLink&) const = default;
};

// What compressing a kept activation set costs on the profiled machine (ActivationStore::encode
// and decode, their buffers included), per element of the set's values, measured once per rank
// outside any step: a compressed run pays encode after the set's last forward read and decode
// before its first backward read, on the compute lane.
struct ActivationCodec {
  double encode_s_per_element = 0;
  double decode_s_per_element = 0;
  bool operator==(const ActivationCodec&) const = default;
};

// The layout the segments were measured in, which decides which segments a layer has
// (docs/distributed.md): sequence parallelism (parallel.sequence_parallel: the shard segments
// "attention_in", "mlp_in" and "head_in" beside the layers, reduce-scatters and all-gathers in
// place of all-reduces) at every degree above 1, and context parallelism over `cp` ranks
// (parallel.cp, parallel.cp_kind: the all-to-all kind's "attention_core" and "attention_out",
// the ring's "attention_ring", "attention_recv" and "attention_out", with their transfers over
// the context-parallel group among the collectives). A degree-1 group has no sequence-parallel
// segments: under sequence parallelism the degrees priced are those above 1.
struct ProfiledLayout {
  bool sequence_parallel = false;
  int cp = 1;
  ops::ContextParallelKind cp_kind = ops::ContextParallelKind::all_to_all;  // where cp > 1
  bool operator==(const ProfiledLayout&) const = default;
  // Neither sequence nor context parallelism: the cost model's plain tensor-parallel layers.
  bool plain() const { return !sequence_parallel && cp == 1; }
  // "sequence parallelism, cp 2 (ring)"; "no sequence or context parallelism" when neither.
  std::string describe() const;
};

// The segment kind of a segment name, by which a profile keys its times ("attention.3" ->
// "attention", "attention_ring.3.1" -> "attention_ring").
std::string segment_kind(const std::string& name);

// The segment kinds of an MoE layer, in program order.
inline constexpr const char* kMoeKinds[] = {"moe_dispatch", "experts", "moe_combine"};

struct Profile {
  // Version 4 added the MoE model keys, collective_elements, ep and expert_link; version 5
  // the layout (sequence_parallel, cp, cp_kind). Older profiles read as before, measured
  // without sequence or context parallelism.
  static constexpr int kVersion = 5;
  static constexpr int kOldestVersion = 3;
  model::ModelConfig model;
  int tp = 1;
  std::int64_t micro_batch = 1;
  int sub_batches = 1;
  // Bytes of one activation element of the run's precision (4: fp32, 8: fp64, 2: bf16 and
  // fp16).
  std::int64_t element_bytes = 4;
  // The memory model's bytes held per byte of this rank's (master) parameters
  // (DegreeProfile::parameter_bytes), by kind, from the engine's memory figures
  // (train::MemoryFigures, the start-up line and the metrics param_bytes, grad_bytes,
  // optimizer_bytes):
  //   param_bytes_ratio: the parameters: the master copy, 2bw's second version and under mixed
  //     precision the 16-bit working copy (1.5 for bf16 over fp32 masters);
  //   grad_bytes_ratio: the gradient accumulators (under ZeRO-2 this rank's blocks);
  //   optimizer_bytes_ratio: the optimizer's state (AdamW: 2 moments; under ZeRO this rank's
  //     blocks).
  // What parallel.offload keeps off memory is taken off the optimizer's state first and the
  // rest (the master weights of "optimizer+params") off the parameters, so that each is what
  // stays resident.
  double param_bytes_ratio = 1;
  double grad_bytes_ratio = 1;
  double optimizer_bytes_ratio = 2;
  // The settings the ratios were measured under: train.precision, parallel.zero and
  // parallel.offload. precision is empty when the profile does not record them.
  std::string precision;
  int zero = 0;
  std::string offload = "none";
  // Profiles are measured at dp = 1, where ZeRO shards nothing; with_zero_share() sets the
  // data-parallel group the ratios were then divided over (not stored in the file).
  int data_parallel = 1;
  std::vector<DegreeProfile> degrees;  // ascending
  std::map<std::string, double> reshards;  // "a-b" with a < b -> seconds
  // The expert-parallel group the MoE layers' all-to-alls span (parallel.ep) and its link
  // (measured when ep > 1).
  int ep = 1;
  ExpertLink expert_link;
  // Per MoE layer (by layer index), the busiest expert-parallel rank's kept assignments over
  // the mean rank's, from the routing of the profiled steps (ep > 1; absent layers: 1). The
  // engine computes only the tokens routed to an expert and every rank waits for the combine's
  // all-to-all, so a layer's experts take the busiest rank's time: the simulation scales the
  // experts' profiled time (the mean rank's, as an ep = 1 run has it) by this.
  std::map<int, double> expert_load_imbalance;
  // The link the replicas' gradients cross: at tp > 1 the degree-1 replicas' all-reduce
  // (DegreeProfile::replica_reduce_per_layer_s), at tp = 1 one over the copies of the group a
  // launcher ran beside it. A cluster description of this machine takes its link's efficiency
  // at that transfer size from it (cluster::calibrate_replica_link). Optional in the file.
  ReplicaLink replica_link;
  // By parallel.activation_compression's word ("bf16", "fp8"); empty where not measured (a
  // simulation then prices the passes by the device's memory bandwidth). Optional in the file.
  std::map<std::string, ActivationCodec> activation_codec;
  ProfiledLayout layout;

  // The bytes held per parameter byte besides one copy of the parameters and one of the
  // gradients (the sum of the three ratios less 2; may be negative): the profile's
  // "optimizer_state_ratio", the single figure profiles carried before the three.
  double optimizer_state_ratio() const {
    return param_bytes_ratio + grad_bytes_ratio + optimizer_bytes_ratio - 2.0;
  }
  // "zero 1, offload none, precision bf16"; empty when the profile does not record them.
  std::string memory_settings() const;

  const DegreeProfile* at_degree(int degree) const;
  // Seconds of the reshard between degrees a and b in either direction (0 when a == b);
  // UserError when the profile lacks it.
  double reshard_seconds(int a, int b) const;
  static std::string reshard_key(int a, int b);  // "a-b", smaller first
};

// The busiest of `ep` expert-parallel ranks' load over the mean rank's, given each expert's
// kept assignments (rank j holds experts [j E / ep, (j + 1) E / ep), as model::Model places
// them): Profile::expert_load_imbalance of one layer. 1 when nothing was routed. UserError
// when ep does not divide the experts.
double expert_load_imbalance(const std::vector<double>& tokens_per_expert, int ep);

// `profile` for a run of ZeRO stage `zero` over `dp` data-parallel ranks: each rank keeps 1/dp
// of the optimizer state (zero >= 1), of the gradients (>= 2) and of the parameters (3). A
// layer below tp shares its blocks over a larger replica group, which this leaves out (the
// model counts more than such a rank holds).
Profile with_zero_share(Profile profile, int zero, int dp);

std::string to_json(const Profile& profile);
// UserError naming `source` when the text is not a profile of this format and version, or
// when a time, byte count, slowdown or ratio in it is not finite and >= 0 (degrees, rows,
// tp, micro_batch, sub_batches and element_bytes > 0): the message names the field and value.
Profile profile_from_json(const std::string& text, const std::string& source);
void write_profile(const Profile& profile, const std::string& path);  // atomic
// profile_from_json of the file at `path`, which must be a regular file of at most
// kMaxJsonFileBytes (core/regular_file.h).
Profile read_profile(const std::string& path);

// UserError when the profile was measured for another model or batch split, or lacks one of
// `degrees`, saying what differs and how to re-measure. Mixture-of-experts settings are part of
// the model; a run with expert-parallel groups of `ep` > 1 ranks needs a profile whose link
// was measured over such a group (ep < 1: not checked).
void check_profile_matches(const Profile& profile, const model::ModelConfig& model,
                           std::int64_t micro_batch, int sub_batches,
                           const std::vector<int>& degrees, const std::string& source,
                           int ep = 0);
// UserError when the profile was measured in another layout than `layout` (the run's), saying
// which setting differs and how to re-measure.
void check_profile_layout(const Profile& profile, const ProfiledLayout& layout,
                          const std::string& source);

}  // namespace oases::planner
