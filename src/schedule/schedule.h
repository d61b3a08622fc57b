// Schedule IR: per rank, an ordered list of instructions over a Program's segments and
// collectives (ops/program.h). Generators are pure functions of (Program, ScheduleSpec); the
// runtime executes a Schedule on devices and the simulator executes the same list on a cost
// model. Schedules print one instruction per line and parse back (to_string, parse_schedule),
// so tests can diff them and write them as text; schedule_grid.h draws several ranks' schedules
// side by side, as the verifier's errors show them.
//
// The generators share one construction. Each (micro-batch, sub-batch) instance of the
// program gets its own instruction stream: forward through every segment, then backward,
// with the recomputation policy deciding which tensor sets are freed after Forward and
// regenerated before Backward. The streams of the sub-batches of a micro-batch are then cut
// after every collective Start into phases and interleaved phase by phase, so the collective
// of one sub-batch is in flight while the others compute (with one sub-batch this is the
// plain blocking order). Micro-batches run one after another, except under
// oases-interleaved: there the forward of micro-batch k + 1 is cut into phases too and
// interleaved with the backward of micro-batch k (every sub-batch of both), so that a forward
// collective, which has little forward compute to hide behind, is in flight while backward
// compute runs, and the other way round; the first phases of the forward of k + 2 join the end
// of that window, so that the backward's last collectives, too, have forward compute beside
// them (with more than two micro-batches). Backward instructions keep their relative order, so
// gradients accumulate in the same order as under oases and the results are equal bit for bit;
// two micro-batches' activations are live at once instead of one. oases-deferred is
// oases-interleaved with every backward input-only (zero-bubble's split, below) and the weight
// parts deferred into the windows that forward phases leave open: a forward collective with
// only forward compute behind it (with two micro-batches, at the end of the second forward,
// which has more collectives than the backward it is interleaved with has phases; with more,
// the forward's lead leaves no such window, and each weight part runs right after its
// segment's input part, whose collective is then already in flight). Weight gradients then
// accumulate in another order than under oases, so the results agree to rounding instead of
// bit for bit; at most one micro-batch's weight parts (and the sets they read) wait at once.
//
//   schedule            recompute                ARs per layer fwd/recompute/bwd   overlap
//   megatron            none | full | selective  2 / 0|2|0 / 2                     no
//                       | sqrt                   2 / 2 / 2 with sqrt
//   fine-grained        fine-grained | none      2 / 0 / 2                         no
//   cross-pass          full (default) | any     2 / 2 / 2 with full or sqrt       yes
//   oases               fine-grained | none      2 / 0 / 2                         yes
//   oases-interleaved   fine-grained | none      2 / 0 / 2                         yes, across
//                                                                                  micro-batches
//   oases-deferred      fine-grained | none      2 / 0 / 2                         as above, and
//                                                                                  weight parts
//                                                                                  fill windows
//
// Recomputation per layer (ScheduleSpec::layer_recompute): each transformer layer may take its
// own policy (none, selective, full or fine-grained, as the kind allows). A segment frees and
// regenerates what its layer's policy says; a full layer is a replay group of its own, whose
// first checkpoint stays live, so its neighbours' policies change nothing of it.
//
// Recomputation in groups of layers (sqrt; Chen et al. 2016, "Training deep nets with
// sublinear memory cost"). Full recomputation keeps every layer's input and replays one layer
// at a time; sqrt keeps only the input of the first layer of each group of k consecutive
// layers (group g: layers [g k, (g + 1) k), the last group shorter when k does not divide L),
// drops everything else of the group after its forward, and in the backward pass, on reaching
// the group's last segment, replays the whole group's forward from that kept input (every
// segment's sets and output, forward collectives included, as full replays one layer), then
// runs the group's backward. Live at the peak: about L / k kept layer inputs plus one group's
// full activations, ~ 2 sqrt(L) layers' worth at k = round(sqrt(L)), for one extra forward of
// every layer (as full). With k = 1 the schedule is full's, instruction for instruction.
// Groups follow the model's layer numbers and are cut where a segment outside the layers
// (a reshard between degrees, a pipeline chunk boundary) sits between two layers: each part
// is replayed from its own first layer's input, so a group never spans ranks.
//
// Interleaving micro-batches is sound because a segment's forward instructions touch only
// forward slots (ops::Slot::output, reshard) and the (mb, sb)-keyed activation store, and its
// backward instructions only gradient slots and the store (a weight part only the store: the
// instance's sets and its stash): the forward of k + 1 never overwrites what the backward of k
// still reads in the same sub-batch's slots, and the forwards of k + 1 and k + 2, which run at
// once, use slots of their own (slot_lanes). Recomputation
// that regenerates a segment's output (full) would write the forward slot during backward,
// which is why the interleaved kind implies fine-grained recomputation (or none at all).
//
// Pipelines. A pipeline cuts the model into chunks (stages) on different ranks. Each rank's
// Program holds the segments of its own chunks, numbered locally; a chunk that does not start
// the model begins with an input_from_peer segment and one that does not end it finishes with
// an output_to_peer segment (ops/program.h). Activations cross a cut by Send/Recv in forward,
// their gradients in backward. A receive is two instructions: RecvStart posts it (into a
// buffer of the receiving instance's own) and RecvWait, later, waits for its data, so that the
// transfer can overlap whatever the rank computes in between. Messages match per ordered pair
// of ranks in issue order: the i-th Send from a to b pairs with the i-th RecvStart at b from a
// (MPI matches nonblocking receives per source, tag and communicator in the order they are
// posted; NCCL's send/recv rule is the same). A schedule must not deadlock even under
// rendezvous semantics, the strictest an executor may give them: a Send blocks until its
// partner's RecvStart has been issued, a RecvWait until its partner's Send has, and a RecvStart
// never blocks. schedule/pipeline_lowering.h lowers pipeline orders to schedules with messages.
//
// Zero-bubble pipelines split a backward pass: Backward(input_only) runs a segment's stages
// without the weight gradients it can defer (ops::SegmentShape::has_weight_part), which is all
// the previous segment and the previous chunk wait for; BackwardWeight runs them later, once
// per instance. The sets it reads stay live until then and its stashed output gradients count
// as activations; gradient buckets become final only after their weight parts.
//
// ZeRO-3. With parameters sharded across the data-parallel ranks (ScheduleSpec::sharded_params)
// a rank keeps only its own block of each parameter bucket between uses: shard_parameters
// brackets the compute that reads a bucket (ops::SegmentShape::param_buckets) with
// GatherParams and WaitParams before and ReleaseParams after, and the verifier holds every
// compute instruction to gathered parameters. The generators' and the pipeline lowerings'
// schedules are sharded so after the fact; no-flush (2bw) runs are not.
#pragma once

#include "core/named_values.h"
#include "ops/program.h"

#include <array>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace oases::schedule {

// What each instruction does, in words; (mb, sb) is the instance of the program it acts on.
enum class Op : std::uint8_t {
  forward,         // Forward(s, mb, sb): run segment s; all its tensor sets become live and its
                   //   output fills the sub-batch's collective buffer
  recompute,       // Recompute(s, sets, mb, sb): regenerate `sets` (kOutput: and the output)
  backward,        // Backward(s, stage, mb, sb); input_only: the stage's input part alone
                   //   (zero-bubble; s has a weight part, ops::SegmentShape::has_weight_part)
  backward_weight, // BackwardWeight(s, mb, sb): the weight part an input-only backward of
                   //   (s, mb, sb) deferred; once, after its last backward stage
  start,           // Start(collective of s in direction, mb, sb): issue asynchronously
  wait,            // Wait(...): later instructions may use the reduced buffer
  free,            // Free(s, sets, mb, sb)
  reduce_grads,    // ReduceGrads(bucket): start the data-parallel reduction of a bucket of
                   //   gradients that are final
  optimizer_step,  // OptimizerStep
  send,            // Send(payload, s, mb, sb, peer, slot):
                   //   activation: peer's slot := output of segment s for (mb, sb)
                   //               (s is output_to_peer; after its Forward and forward Wait)
                   //   gradient:   peer's slot := gradient of the input of s for (mb, sb)
                   //               (s is input_from_peer; after its last backward stage)
  recv,            // RecvStart(payload, s, mb, sb, peer, slot): post the receive of the
                   //   matching Send from peer into the receive buffer of s for (mb, sb)
                   //   (ops::Segment::recv_buffer); never blocks. The buffer holds nothing
                   //   usable until the RecvWait of the same receive.
  recv_wait,       // RecvWait(payload, s, mb, sb, peer, slot): wait until the receive posted
                   //   by the RecvStart with the same fields has arrived; then
                   //   activation: input of segment s for (mb, sb) := the message
                   //               (s is input_from_peer; before its Forward)
                   //   gradient:   gradient of the output of s for (mb, sb) := the message
                   //               (s is output_to_peer; before its backward stage 0)
  use_weights,     // UseWeights(batch): the following compute instructions run on the weight
                   //   version that `batch` computes with (2bw: weight stashing), until the
                   //   next UseWeights or OptimizerStep
  encode,          // Encode(s, sets, mb, sb): hold live `sets` encoded (compress_kept_sets);
                   //   nothing reads them until their Decode
  decode,          // Decode(s, sets, mb, sb): bring encoded `sets` back, rounded by the encoding
  gather_params,   // GatherParams(bucket): start gathering the bucket's parameters from the
                   //   ranks that own their blocks (ZeRO-3; shard_parameters); asynchronous
  wait_params,     // WaitParams(bucket): the gather has arrived; compute may read the bucket
  release_params,  // ReleaseParams(bucket): give back the blocks of the bucket's parameters
                   //   this rank does not own; they read as nothing until gathered again
  partition,       // Partition(s, sets, mb, sb): keep only this rank's slice of live `sets`
                   //   (the checkpoint of a segment with SegmentShape::checkpoint_replicated);
                   //   nothing reads them until their WaitSets (partition_kept_checkpoints)
  gather_sets,     // GatherSets(s, sets, mb, sb): start the all-gather over the segment's
                   //   collective group that makes partitioned `sets` whole; asynchronous
  wait_sets,       // WaitSets(s, sets, mb, sb): the gather has arrived; the sets read again
};

// GatherParams, WaitParams and ReleaseParams: they name a bucket and nothing else (segment -1),
// and compute nothing.
inline bool is_parameter_op(Op op) {
  return op == Op::gather_params || op == Op::wait_params || op == Op::release_params;
}

enum class Direction : std::uint8_t { forward, backward };

// What a point-to-point message carries across a chunk boundary.
using ops::Payload;  // activation, gradient (ops/program.h)

// Fields an op does not use keep their defaults (the verifier checks bucket, peer and slot), so
// instructions compare equal exactly when they do the same thing.
struct Instruction {
  Op op;
  // Index into this rank's Program; -1 for ReduceGrads, OptimizerStep, UseWeights and the
  // parameter instructions.
  int segment = -1;
  int stage = 0;  // backward stage
  Direction direction = Direction::forward;  // which collective of the segment (start/wait)
  int micro_batch = 0;
  int sub_batch = 0;
  ops::TensorSets sets = 0;  // recompute: sets regenerated; free: sets freed
  bool replay = false;       // start/wait: a forward collective replayed by a recomputation
  // backward: the stage runs its input part only, deferring the segment's weight gradients to
  // a BackwardWeight of the instance. All stages of an instance agree.
  bool input_only = false;
  // Model chunk (pipeline stage, numbered along the model) the instruction belongs to. Every
  // instruction of a segment names the same chunk.
  int chunk = 0;
  // reduce_grads: the gradient bucket (ops::SegmentShape::ready_bucket); gather_params,
  // wait_params, release_params: the bucket whose parameters they move
  // (ops::SegmentShape::param_buckets).
  int bucket = -1;
  Payload payload = Payload::activation;  // send/recv
  int peer = -1;  // send/recv/recv_wait: the other rank, as its rank in the point-to-point group
  // send/recv/recv_wait: the message's tag, which names it in traces (one per message of a step
  // for each payload and pair of ranks). >= 0.
  int slot = -1;
  // Which batch of the run the instruction belongs to. 0: the run's own batch, the only one
  // outside no-flush pipelines; -1: the previous batch, whose last backwards, gradient
  // reductions and optimizer step a run of a no-flush pipeline (2bw, pipeline_lowering.h)
  // finishes. Instances (mb, sb) of different batches are different instances.
  int batch = 0;
  ops::ActivationEncoding encoding = ops::ActivationEncoding::bf16;  // encode: how
  bool operator==(const Instruction&) const = default;
};

using Schedule = std::vector<Instruction>;

// Which of an instance's collectives a Start or Wait (0 forward, 1 backward) or a GatherSets or
// WaitSets (2: the gather of a partitioned checkpoint) names: what matches a wait to its start.
inline int collective_channel(const Instruction& ins) {
  if (ins.op == Op::gather_sets || ins.op == Op::wait_sets) return 2;
  return ins.direction == Direction::forward ? 0 : 1;
}

enum class ScheduleKind {
  megatron,
  fine_grained,
  cross_pass,
  oases,
  oases_interleaved,
  oases_deferred,
};
enum class Recompute { none, full, selective, fine_grained, sqrt };

inline constexpr std::array<NamedValue<ScheduleKind>, 6> kScheduleKindNames{{
    {ScheduleKind::megatron, "megatron"},
    {ScheduleKind::fine_grained, "fine-grained"},
    {ScheduleKind::cross_pass, "cross-pass"},
    {ScheduleKind::oases, "oases"},
    {ScheduleKind::oases_interleaved, "oases-interleaved"},
    {ScheduleKind::oases_deferred, "oases-deferred"},
}};
inline constexpr std::array<NamedValue<Recompute>, 5> kRecomputeNames{{
    {Recompute::none, "none"},
    {Recompute::full, "full"},
    {Recompute::selective, "selective"},
    {Recompute::fine_grained, "fine-grained"},
    {Recompute::sqrt, "sqrt"},
}};
inline constexpr std::array<NamedValue<Payload>, 2> kPayloadNames{{
    {Payload::activation, "activation"},
    {Payload::gradient, "gradient"},
}};
std::string_view name(ScheduleKind kind);
std::string_view name(Recompute policy);
std::string_view name(Payload payload);
// The kind or policy a name above gives; UserError naming `setting`, the text and the names.
ScheduleKind parse_schedule_kind(std::string_view text, std::string_view setting);
Recompute parse_recompute(std::string_view text, std::string_view setting);

// The policies a layer may take on its own (all but sqrt), quoted for messages: "\"none\",
// \"full\", \"selective\", \"fine-grained\"".
std::string quoted_layer_recompute_names();

// Whether the schedule runs compute while its own tensor-parallel collectives are on the wire
// (cross-pass and the oases kinds; megatron and fine-grained block on each collective).
bool overlaps_collectives(ScheduleKind kind);

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::megatron;
  Recompute recompute = Recompute::none;
  int micro_batches = 1;
  int sub_batches = 1;
  bool training = true;  // false: forward passes only (evaluation, generation)
  // sqrt: layers per recomputation group, k >= 1 (plan::schedule_spec resolves
  // parallel.recompute_every, by default default_recompute_every(model layers)). The other
  // policies do not read it.
  int recompute_every = 0;
  // ZeRO-3 (parallel.zero = 3): parameters are sharded between uses, and the schedule gathers
  // each bucket before the compute that reads it (shard_parameters). The verifier then holds
  // every compute instruction to gathered parameters.
  bool sharded_params = false;
  // parallel.zero3_reshard_after_forward: true releases a bucket after its forward uses and
  // gathers it again for the backward; false keeps it from a micro-batch's forward to its
  // backward.
  bool reshard_after_forward = true;
  // ZeRO-1 and 2: each rank updates only its blocks, and the run's schedule gathers the
  // others' updated blocks of each bucket ahead of its first use (shard_parameters), where the
  // gathers travel while the forward computes; nothing is released. Exclusive with
  // sharded_params.
  bool deferred_param_gather = false;
  // parallel.partition_activations (ZeRO-R): training schedules hold the replicated
  // checkpoints as slices between the passes (partition_kept_checkpoints, applied after
  // generation like shard_parameters); what the engine runs and the planner prices.
  bool partitioned_checkpoints = false;
  // Recomputation per transformer layer (parallel.recompute as a list): empty, every layer
  // runs `recompute`; else one policy per layer of the whole model, indexed by
  // ops::SegmentShape::layer (global under a pipeline too), and `recompute` is left to the
  // segments outside the layers. Each entry is none, selective, full or fine-grained (never
  // sqrt, whose groups span layers); check_spec holds each to the kind as it holds
  // `recompute`. A layer under full replays its own segments from its input, whatever its
  // neighbours do, so policies mix freely along the model.
  std::vector<Recompute> layer_recompute = {};

  // The policy of the segment's layer: layer_recompute's entry, or `recompute` (a segment
  // outside the layers, or one policy for all). REQUIRES: the layer within layer_recompute.
  Recompute recompute_of(const ops::SegmentShape& shape) const;
};

// k = round(sqrt(layers)), at least 1: the group size that minimises L / k + k, kept inputs
// plus one group, when an input counts as much as a layer's activations (Chen et al.'s model).
// A GPT layer's input is about 1/16 of its activations, so there the bytes are fewest near
// k = sqrt(L / 16) instead: k = 1 (full recomputation) up to about 32 layers.
int default_recompute_every(std::int64_t layers);

// The policy as the start-up log and the plan report name it: "full", "sqrt (groups of 3
// layers)", or per layer, runs of equal policies in layer order while there are at most four
// ("per layer: full x2, none x2"), else how many layers take each ("per layer: 12 full, 20
// none").
std::string describe_recompute(const ScheduleSpec& spec);

// The policy as parallel.recompute writes it, "auto" resolved: one word ("full"), or one per
// layer joined by commas ("full,none,selective,none").
std::string recompute_words(const ScheduleSpec& spec);

// UserError when the combination cannot run: fine-grained, oases, oases-interleaved and
// oases-deferred recompute fine-grained or not at all (recompute "fine-grained" or "none");
// sqrt recomputation runs under megatron and cross-pass only, with recompute_every >= 1;
// megatron and fine-grained run whole micro-batches (one sub-batch). Per layer
// (layer_recompute), each layer's policy obeys the same rules (the message names the layer),
// and sqrt is no layer's.
void check_spec(const ScheduleSpec& spec);

// How many micro-batches' slots (ops::Slot) the schedules of `spec` use at once: micro-batch
// mb uses lane mb % slot_lanes(spec) (ops::ModelContext::slot_lanes). 2 for training under
// oases-interleaved and oases-deferred with more than two micro-batches, whose windows run the
// first phases of the forward of k + 2 beside the last ones of the forward of k + 1; else 1.
// The verifier holds schedules to it, so a schedule that is valid with 1 lane is valid with 2.
int slot_lanes(const ScheduleSpec& spec);

// The generator for spec.kind.
Schedule generate(const ops::Program& program, const ScheduleSpec& spec);

// The parts generate() is made of, for passes that place micro-batches themselves (pipeline
// lowering). micro_batch_forward: the forward instructions of micro-batch mb, every sub-batch,
// interleaved phase by phase as generate() interleaves them (with frees where the policy drops
// sets; the whole of the micro-batch's instructions when spec.training is false).
// micro_batch_backward: its recomputation, backward and frees, interleaved the same way
// (REQUIRES: spec.training). generate() itself interleaves each micro-batch's forward and
// backward streams as one (oases-interleaved: the backward of mb with the forward of mb + 1), so
// the two parts concatenated can differ from its order at the seam. A pipeline places the parts
// itself, so there oases-interleaved and oases-deferred order each micro-batch as oases does.
Schedule micro_batch_forward(const ops::Program& program, const ScheduleSpec& spec, int mb);
Schedule micro_batch_backward(const ops::Program& program, const ScheduleSpec& spec, int mb);
// Segments [begin, end) of a program: one model chunk of a rank that holds several (an
// interleaved pipeline), from an input_from_peer segment or segment 0 to an output_to_peer
// segment or the last one.
struct SegmentRange {
  int begin = 0;
  int end = 0;
};
// The parts above for the segments of `chunk` alone, generated as if they were the whole
// program (so a forward-only chunk frees its sets by its own last segment); instructions name
// the segments by their index in `program`. REQUIRES: chunk within the program, non-empty, and
// no segment of it reads the sets of a segment outside it.
Schedule micro_batch_forward(const ops::Program& program, const ScheduleSpec& spec, int mb,
                             SegmentRange chunk);
Schedule micro_batch_backward(const ops::Program& program, const ScheduleSpec& spec, int mb,
                              SegmentRange chunk);
// Zero-bubble's split of micro_batch_backward (REQUIRES: spec.training):
// micro_batch_backward_input: the same instructions, except that segments with a weight part
// (ops::SegmentShape::has_weight_part) run their backward stages input_only and the Frees of
// sets a BackwardWeight will read (the segment's own, and those of its reads_sets_of owners)
// are left out. micro_batch_backward_weight: for every sub-batch in turn, BackwardWeight of each
// segment with a weight part, last segment first, each followed by the Frees left out above
// whose last reader it is. Running the input part, then (any time later) the weight part, gives
// the gradients micro_batch_backward gives; each weight gradient accumulates over the
// instances in the order their weight parts run.
Schedule micro_batch_backward_input(const ops::Program& program, const ScheduleSpec& spec, int mb);
Schedule micro_batch_backward_weight(const ops::Program& program, const ScheduleSpec& spec, int mb);
// The two parts for the segments of `chunk` alone, as the SegmentRange variants above.
Schedule micro_batch_backward_input(const ops::Program& program, const ScheduleSpec& spec, int mb,
                                    SegmentRange chunk);
Schedule micro_batch_backward_weight(const ops::Program& program, const ScheduleSpec& spec, int mb,
                                     SegmentRange chunk);
// Inserts ReduceGrads(bucket) right after the instruction that makes the bucket final: the later
// of the last backward stage of the segment that makes it final (its last occurrence in
// `schedule`) and the last BackwardWeight of that or a later segment. Then appends
// OptimizerStep.
void append_gradient_reductions(const ops::Program& program, Schedule& schedule);

// Checks that the schedule can run: every data dependency is met (a segment's input has been
// computed and, where a collective reduces it, waited on; backward stages after the following
// segment's backward and after their collective), no tensor set is read before it is produced
// or after it is freed, collectives are started once and waited once, every instance runs its
// whole program, nothing is left live at the end, and gradient buckets are reduced only once
// final. At chunk boundaries (the program's output_to_peer and input_from_peer flags must pair
// up): the Forward of an input_from_peer segment follows its RecvWait(activation) and reads no
// previous segment; Send(activation) follows the Forward (and the Wait of its forward
// collective) of an output_to_peer segment, whose backward stage 0 follows its RecvWait(gradient)
// instead of the next segment's backward; Send(gradient) follows the last backward stage of an
// input_from_peer segment. Each of the four messages of an instance happens at most once, only
// on segments with the matching flag, with peer >= 0 and slot >= 0, and by the end all have
// happened (only the activations in a forward-only schedule). A receive is posted (RecvStart)
// once and waited (RecvWait, with the same fields) once, after its post; what it carries is
// usable only from its RecvWait on (a Forward or backward stage 0 that reads it earlier is
// rejected at that instruction), and a receive posted but never waited is rejected naming the
// position of its RecvStart. Every instruction of a segment
// names one chunk, shared with its neighbours unless a chunk boundary lies between them.
// Zero-bubble: an input_only backward names a segment with a weight part, and every stage of
// the instance is input_only; its BackwardWeight runs exactly once, after the instance's last
// backward stage, while every set it reads is live (a Free of such a set before it is
// rejected at the Free); a bucket is final only once the BackwardWeights of its segments (from
// its ready segment on) have run too.
// Sharded parameters (spec.sharded_params; shard_parameters): each bucket's parameters start
// sharded; GatherParams(b) takes a sharded bucket to gathering, WaitParams(b) a gathering one
// to gathered, ReleaseParams(b) a gathered one back to sharded, and any other move is rejected
// (a second gather, a wait without a gather in flight, a release of a bucket not gathered). A
// Forward, Recompute, Backward or BackwardWeight computes only while every bucket of its
// segment's param_buckets is gathered, and every bucket is sharded again by the end. Parameter
// instructions name a bucket >= 0 and nothing else (segment -1, every other field at its
// default; batch 0). Deferred gathers (spec.deferred_param_gather): the same moves and the same
// rule for compute, except that ReleaseParams is rejected and buckets end gathered (each is
// gathered at most once). Without either a parameter instruction is rejected.
// Throws InternalError naming the first violating instruction (its index and text) on its first
// line, and below it the grid of the schedule around that instruction (schedule_grid.h: a few
// positions before and after it, the instruction marked; a violation found at the end marks
// the end, or the RecvStart of a receive never waited). verify.cc holds the verifiers.
//
// No-flush runs (2bw) declare what they share with the runs before and after them in `carry`:
// `earlier` holds what earlier runs ran of batch -1 (its forwards, its first backwards and
// their messages), checked first as a prefix; `carried_out` the micro-batches of batch 0 whose
// backward a later run runs: they must have run forward (and sent their outputs) and not begun
// backward, and their sets may stay live; with `steps_later` batch 0's gradient reductions and
// optimizer step are left to a later run too, and `gradient_sent_later` names micro-batches of
// batch 0 whose backward completes here but whose input gradient the next run sends (first
// thing, before it computes). With carry.weight_versions every compute instruction
// must follow a UseWeights of its batch with no OptimizerStep between them. Either way each
// batch whose backward this run completes is reduced bucket by bucket and stepped
// (OptimizerStep names the batch in `batch`) exactly once, and no backward of batch 0 runs
// before the optimizer step of batch -1 (the batches share the gradient buffers).
struct RunCarry {
  bool weight_versions = false;
  Schedule earlier;
  std::vector<int> carried_out;
  std::vector<int> gradient_sent_later;
  bool steps_later = false;
};
void verify_schedule(const ops::Program& program, const ScheduleSpec& spec,
                     const Schedule& schedule, const RunCarry& carry = {});

// Checks that the ranks of one group (one schedule each) issue their collectives in the same
// order, which the communicators' issue-order matching requires. Throws InternalError naming
// the first rank and position that differ, with the grid of every rank's Starts (one row per
// collective) around it, the two differing cells marked. The group is the tensor-parallel one, whose
// collectives are the segments' Starts; other instructions are not compared. GatherParams are
// collectives of the data-parallel group instead, whose ranks (the replicas of one model
// chunk) run one schedule, and so issue them in one order.
void verify_collective_order(const std::vector<Schedule>& schedules_of_group);

// Checks the Send/Recv of a point-to-point group (schedules_of_group[r]: rank r's schedule,
// peers are indices into it), each schedule already verified alone:
//  - every peer is a rank of the group other than the sender or receiver itself;
//  - for every ordered pair (a, b) the i-th Send from a to b and the i-th RecvStart at b from a
//    carry the same payload, micro-batch, sub-batch and slot, and go one chunk along the model
//    (an activation from chunk c to c + 1, a gradient from c to c - 1); as many of each;
//  - run with rendezvous semantics (a Send blocks until its partner's RecvStart has been
//    issued, a RecvWait until its partner's Send has, RecvStart and everything else proceed),
//    every rank reaches its end.
// Throws InternalError naming the ranks, positions (instruction indices) and instructions:
// both sides of a mismatched pair, the first message without a partner, or every rank blocked
// in a deadlock with what it waits for; below that line, the grid of the group's schedules
// around those positions, each of them marked. Time about linear in the total length.
void verify_point_to_point(const std::vector<Schedule>& schedules_of_group);

// Peak bytes of tensor sets live at once when `schedule` runs (what the executor's activation
// store will report), from the set sizes in the program; an input-only backward stage 0 adds
// the segment's deferred_gradient_bytes (its stash), which its BackwardWeight releases; a
// RecvStart adds the segment's received_bytes, which the Forward (after acquiring its sets) or
// backward stage 0 that reads the receive releases. An Encode converts set by set, each time
// holding the new block beside the old one for a moment before giving the old one back (bytes /
// program.set_element_bytes elements of the encoding); a Decode likewise.
std::size_t peak_activation_bytes(const ops::Program& program, const Schedule& schedule);

// Compressed activations (parallel.activation_compression; Gist's delayed precision
// reduction): holds every kept set encoded from its producer's last forward-side use to the
// first backward-side instruction that reads it. For each live interval of a set (from the
// Forward that produces it to its Free) whose readers include a Forward (the segment's own, the
// next segment's epilogue reading its checkpoint, a loss segment reading the head's logits) and
// a later Recompute, Backward or BackwardWeight, it inserts Encode right after the last
// forward-side reader before the first backward-side one, and Decode right before that one,
// when compute of other instances runs between them (else nothing would be saved). The
// segment's own collectives and messages count as readers of its sets on their side (forward
// collectives and activations forward-side; replays, backward collectives and gradients
// backward-side), since they may use buffers kept with the instance. Sets a
// Recompute produces are read only backward-side and stay as they are; so do sets still live at
// the end (carried to a later run). The forward's own reads see full precision; backward reads
// the encoding's rounding. Results are those of the schedule with every such set rounded once.
// REQUIRES: `schedule` verifies; the result verifies too.
void compress_kept_sets(const ops::Program& program, Schedule& schedule,
                        ops::ActivationEncoding encoding);
// The same per transformer layer (parallel.activation_compression as a list):
// layer_encodings[l] is how the kept sets of the segments of layer l (SegmentShape::layer) are
// held, std::nullopt leaving them as they are; the sets of segments outside the layers (the
// embedding, the head, reshards) stay as they are. REQUIRES: every layer of the program
// within layer_encodings.
void compress_kept_sets(const ops::Program& program, Schedule& schedule,
                        const std::vector<std::optional<ops::ActivationEncoding>>& layer_encodings);

// Partitioned activation checkpoints (parallel.partition_activations; ZeRO-R): a checkpoint
// that is identical on every rank of its segment's collective group (SegmentShape::
// checkpoint_replicated, with more than one rank) is held as this rank's 1/ranks slice from its
// last forward-side reader to the first backward-side one (the live intervals of
// compress_kept_sets, when compute of other instances runs between them): Partition right
// after the last forward-side reader, GatherSets right before the last compute instruction
// of another micro-batch or sub-batch between the two (so that the all-gather travels while it
// computes; where there is none, the last compute instruction between them) and WaitSets right
// before the backward-side reader. Where
// instructions land between the same two, GatherSets come before WaitSets; each kind keeps the
// order of the intervals' Frees, the same on every rank of the group, as its collectives
// require. Results are those of the schedule without the pass.
// REQUIRES: `schedule` verifies and holds no Encode or Decode; the result verifies too.
void partition_kept_checkpoints(const ops::Program& program, Schedule& schedule);

// ZeRO-3 (spec.sharded_params): inserts the gathers and releases of parameter buckets
// (ops::SegmentShape::param_buckets). A bucket's uses (the compute instructions that read it,
// in order) fall into windows: a window ends after a backward-side use (Recompute, Backward,
// BackwardWeight) followed by a forward one, and, with spec.reshard_after_forward, also after
// a forward use followed by a backward-side one. Each window gets GatherParams(b) one compute
// instruction ahead of its first use (so the gather travels while that instruction computes;
// never before the previous window's release), WaitParams(b) right before its first use, and
// ReleaseParams(b) right after its last. Nothing else moves. REQUIRES: `schedule` verifies
// without sharded parameters and holds no parameter instructions; the result verifies with
// them.
// A window also ends where a UseWeights or OptimizerStep lies between two uses (2bw: the
// weights change there), and its GatherParams never comes before the last of those ahead of
// its first use, so every bucket is sharded when the weights change.
// Where no compute instruction precedes a window (the first one of the step) its GatherParams
// opens the schedule, so that it travels while the rank waits for its input. "Ahead of" is
// right before that compute instruction, after whatever (a collective's Wait) precedes it.
// Parameter instructions that land between the same two instructions run releases first, then
// gathers, then waits, each kind by ascending bucket: every data-parallel rank runs the same
// schedule, so all issue their gathers in the same order, as the group's collectives require.
// REQUIRES also spec.sharded_params, and bucket ids >= 0 in param_buckets.
// Deferred gathers (spec.deferred_param_gather; ZeRO-1 and 2): every bucket the schedule reads
// is gathered once, all GatherParams at the start of the schedule in the order of the buckets'
// first uses (so the first bucket's gather arrives first and the rest travel behind it while
// the forward computes), each WaitParams right before its bucket's first use, and nothing is
// released.
void shard_parameters(const ops::Program& program, const ScheduleSpec& spec, Schedule& schedule);

// The text form of instructions (schedule_text.cc), so that tests and bug reports can write
// schedules as text. An instruction is one line: the op's name, then its fields in parentheses,
// separated by commas:
//   Forward(seg=3, mb=0, sb=1, chunk=1)
//   Backward(seg=2, stage=1, mb=0, sb=0, input-only)
//   Start(fwd, seg=2, mb=1, sb=0, replay)
//   Free(seg=2, checkpoint|internals, mb=0, sb=0)
//   Send(activation, seg=5, mb=0, sb=0, peer=1, slot=0)
//   ReduceGrads(bucket=3)
//   OptimizerStep
// Integer fields are written key=value: seg (segment), stage, mb (micro_batch), sb
// (sub_batch), chunk, bucket, peer, slot, batch. The others are bare words: fwd or bwd
// (direction), replay, input-only, activation or gradient (payload), bf16 or fp8 (encoding),
// and the sets, tensor set names joined by '|' (checkpoint, internals, core, output) or - for
// none. Each op has a form, the fields it prints in a fixed order: its instance (seg, mb, sb)
// or bucket, whatever else its line of Op's comment names (Recompute, Free, Encode, Decode and
// the partition ops their sets, Backward its stage, Start and Wait their direction, messages
// their payload, peer and slot, Encode and Decode their encoding, UseWeights its batch), then
// replay (Start, Wait) or input-only (Backward) when set, and chunk and batch when not 0
// (UseWeights: its chunk beside any batch but 0). Any other field follows when it is not at its
// default (Instruction's, except that a Backward's direction is bwd), so that two instructions
// print alike exactly when they are equal. An op with nothing to print is its name alone
// (OptimizerStep).
std::string to_string(const Instruction& instruction);
std::string to_string(const Schedule& schedule);  // one instruction per line, each ending in \n
// The inverse of to_string: parse_instruction(to_string(i)) == i for every instruction i.
// Fields may come in any order, each at most once; those an op's form always prints are
// required; every other field keeps its default. UserError on malformed text, naming the text
// and what was expected (the valid op names, or the op's form and the valid fields).
Instruction parse_instruction(std::string_view text);
// One instruction per line; blank lines and comments (from '#' to the end of the line) are
// ignored. parse_schedule(to_string(s)) == s. UserError as parse_instruction's, naming the line
// number and the line as written.
Schedule parse_schedule(std::string_view text);

}  // namespace oases::schedule
