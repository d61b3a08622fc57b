// The schedule verifiers (schedule.h): verify_schedule walks one rank's list with a model of
// every instance's state; verify_collective_order and verify_point_to_point compare the lists
// of a group. A rejection's message is one line naming the instruction and the reason, followed
// by the grid of the lists around it (schedule_grid.h).
#include "schedule/schedule.h"
#include "schedule/schedule_grid.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <source_location>
#include <string>
#include <string_view>
#include <tuple>

namespace oases::schedule {

using ops::kCheckpoint;
using ops::kCore;
using ops::kInternals;
using ops::kOutput;
using ops::Program;
using ops::SegmentShape;
using ops::TensorSets;

namespace {

const SegmentShape& shape_of(const Program& program, int segment) {
  return program.segments[static_cast<std::size_t>(segment)];
}

bool is_point_to_point(Op op) { return op == Op::send || op == Op::recv || op == Op::recv_wait; }

// Throws the InternalError that OASES_ASSERT would throw at `where` with `message`, the grid on
// the lines after it: the first line reads as it would without the grid.
[[noreturn]] void reject(const std::string& message, const std::string& grid,
                         std::source_location where = std::source_location::current()) {
  try {
    detail::throw_internal_error(where.file_name(), static_cast<int>(where.line()), "ok", message);
  } catch (const InternalError& error) {
    if (grid.empty()) throw;
    throw InternalError(fmt::format("{}\n{}", error.what(), grid), error.location());
  }
}

// The verifier's model of the state of every instance while it walks the schedule.
class Verifier {
 public:
  Verifier(const Program& program, const ScheduleSpec& spec, const Schedule& schedule,
           const RunCarry& carry)
      : program_(program),
        spec_(spec),
        schedule_(schedule),
        carry_(carry),
        chunk_of_(program.segments.size(), -1),
        carried_out_(carry.carried_out.begin(), carry.carried_out.end()) {
    slot_lanes_ = slot_lanes(spec);
    at("in the program");
    for (int s = 0; s < num_segments(); ++s) {
      const SegmentShape& shape = shape_of(program_, s);
      if (!shape.beside_transfers) continue;
      if (s == 0 || s + 1 == num_segments() || shape.has_forward_collective ||
          shape.has_backward_collective || shape.backward_stages != 1 || shape.sets != 0 ||
          shape.input_from_peer || shape.output_to_peer ||
          shape_of(program_, s - 1).beside_transfers)
        fail(
            fmt::format("segment {} ({}) computes beside transfers but is not a single-stage "
                        "segment without collectives or sets between two others",
                        s, shape.name));
    }
    for (int s = 0; s + 1 < num_segments(); ++s)
      if (shape_of(program_, s).output_to_peer != shape_of(program_, s + 1).input_from_peer)
        fail(fmt::format("segments {} and {} do not agree on a chunk boundary between them (one "
                         "is marked output_to_peer or input_from_peer, the other not)",
                         s, s + 1));
  }

  void run() {
    replay_earlier();
    for (std::size_t i = 0; i < schedule_.size(); ++i) step(i, schedule_[i]);
    finish();
  }

 private:
  // partitioned: only this rank's slice is held (Partition); gathering: its GatherSets is in
  // flight; WaitSets makes it live again.
  enum class SetState { absent, live, encoded, partitioned, gathering, freed };
  enum class CollState { none, started, waited };
  enum class PortState { empty, written, in_flight, reduced };
  enum class ReceiveState { none, posted, arrived };
  enum class ParamState { sharded, gathering, gathered };
  // One receive of an instance: posted by its RecvStart (post, at position posted_at of the
  // earlier runs' list or of the schedule), usable once its RecvWait has run.
  struct Receive {
    ReceiveState state = ReceiveState::none;
    std::size_t posted_at = 0;
    bool posted_earlier = false;
    Instruction post{Op::recv};
  };
  struct Instance {
    bool forward_done = false;
    bool output_recomputed = false;
    int stages_done = 0;
    std::map<int, SetState> sets;
    CollState forward_collective = CollState::none;
    CollState replayed_collective = CollState::none;
    CollState backward_collective = CollState::none;
    // The instance's point-to-point messages at chunk boundaries.
    Receive activation_receive, gradient_receive;
    bool activation_sent = false, gradient_sent = false;
    // Zero-bubble: the backward ran input-only; its weight part has run.
    bool input_only = false, weight_done = false;
  };
  // The forward collective buffer of a sub-batch: one segment's output at a time.
  struct Port {
    int segment = -1;
    int micro_batch = -1;
    PortState state = PortState::empty;
    int batch = 0;
  };

  // ---- Walking the lists.

  // Replays carry.earlier (what earlier runs ran of batch -1) before the run's own list.
  void replay_earlier() {
    replaying_ = true;
    for (std::size_t i = 0; i < carry_.earlier.size(); ++i) {
      const Instruction& ins = carry_.earlier[i];
      at("earlier run's instruction ", carry_.earlier, i);
      check(ins.batch == -1, "an earlier run's instruction must belong to batch -1");
      check(ins.op != Op::optimizer_step && ins.op != Op::reduce_grads &&
                ins.op != Op::use_weights && !is_parameter_op(ins.op),
            "an earlier run's part of batch -1 holds only its compute and messages");
      step_instance(i, ins);
    }
    replaying_ = false;
  }

  void step(std::size_t index, const Instruction& ins) {
    at("instruction ", schedule_, index);
    check(ins.batch == 0 || (ins.batch == -1 && !carry_.earlier.empty()),
          "batch outside the run (valid: 0, and -1 in a run that finishes an earlier batch)");
    if (spec_.sharded_params && (ins.op == Op::optimizer_step || ins.op == Op::use_weights)) {
      // The weights change here: a gathered bucket would hold the other ranks' blocks of the
      // version before.
      for (const auto& [bucket, state] : parameters_)
        check(state == ParamState::sharded,
              fmt::format("changes the weights while bucket {} is {}", bucket,
                          state == ParamState::gathering ? "being gathered" : "gathered"));
    }
    if (ins.op == Op::use_weights) {
      check(carry_.weight_versions, "UseWeights in a run without weight versions");
      check(ins.segment == -1, "UseWeights names a segment");
      weights_of_batch_ = ins.batch;
      return;
    }
    step_instance(index, ins);
  }

  // Every instruction but UseWeights, by group: the step's own (optimizer step, reductions,
  // parameters), then those of an instance (compute, collectives, messages, sets).
  void step_instance(std::size_t index, const Instruction& ins) {
    check_unused_fields(ins);
    if (ins.op == Op::optimizer_step) return optimizer_step(ins.batch);
    if (ins.op == Op::reduce_grads) return reduce_grads(ins);
    if (is_parameter_op(ins.op)) return parameter_instruction(ins);
    check(ins.segment >= 0 && ins.segment < num_segments(), "no such segment");
    check(ins.micro_batch >= 0 && ins.micro_batch < spec_.micro_batches, "micro-batch out of range");
    check(ins.sub_batch >= 0 && ins.sub_batch < spec_.sub_batches, "sub-batch out of range");
    check_chunk(ins);
    const SegmentShape& shape = shape_of(program_, ins.segment);
    Instance& inst = instance(ins.batch, ins.segment, ins.micro_batch, ins.sub_batch);
    check_compute_may_run(ins, shape);
    switch (ins.op) {
      case Op::forward: return forward(ins, inst, shape);
      case Op::recompute: return recompute(ins, inst, shape);
      case Op::backward: return backward(ins, inst, shape);
      case Op::backward_weight: return backward_weight(ins, inst, shape);
      case Op::start: return start_collective(ins, inst, shape);
      case Op::wait: return wait_collective(ins, inst);
      case Op::send: return send(ins, inst, shape);
      case Op::recv: return post_receive(index, ins, inst, shape);
      case Op::recv_wait: return wait_receive(ins, inst);
      case Op::free: return free_sets(ins, inst, shape);
      case Op::encode:
      case Op::decode: return encode_or_decode(ins, inst, shape);
      case Op::partition:
      case Op::gather_sets:
      case Op::wait_sets: return partition_instruction(ins, inst, shape);
      default: return;
    }
  }

  // Fields only some ops name.
  void check_unused_fields(const Instruction& ins) const {
    check(ins.chunk >= 0, "negative chunk");
    check(ins.op == Op::reduce_grads || is_parameter_op(ins.op) || ins.bucket == -1,
          "only ReduceGrads and the parameter instructions name a bucket");
    check(is_point_to_point(ins.op) || (ins.peer == -1 && ins.slot == -1),
          "only Send, RecvStart and RecvWait name a peer and a slot");
    check(ins.op == Op::backward || !ins.input_only, "only Backward runs input-only");
  }

  // What every compute instruction needs besides its inputs: the weights of its batch, gathered
  // parameters, and (batch 0's backward) the previous batch's optimizer step.
  void check_compute_may_run(const Instruction& ins, const SegmentShape& shape) const {
    const bool compute =
        ins.op == Op::forward || ins.op == Op::recompute || ins.op == Op::backward;
    if (compute && carry_.weight_versions && !replaying_)
      check(weights_of_batch_ == ins.batch,
            "computes without a UseWeights of its batch since the last OptimizerStep");
    // What an earlier run computed (carry.earlier) ran on its own parameters.
    if ((spec_.sharded_params || spec_.deferred_param_gather) && !replaying_ &&
        (compute || ins.op == Op::backward_weight))
      check_parameters_gathered(shape);
    if (ins.op == Op::backward && ins.batch == 0 && !carry_.earlier.empty())
      check(stepped_.contains(-1),
            "a backward of batch 0 before the optimizer step of batch -1 (the two batches "
            "would mix their gradients)");
  }

  // ---- Compute.

  void forward(const Instruction& ins, Instance& inst, const SegmentShape& shape) {
    check(!inst.forward_done, "forward twice");
    if (shape.beside_transfers) {
      // Beside the previous segment's collective: its checkpoint alone, and no output.
      read(instance(ins.batch, ins.segment - 1, ins.micro_batch, ins.sub_batch), kCheckpoint,
           shape_of(program_, ins.segment - 1));
      read_other_sets(ins, shape);
      inst.forward_done = true;
      return;
    }
    read_input(ins);
    read_other_sets(ins, shape);
    write_output(ins);
    produce(inst, shape.sets);
    inst.forward_done = true;
  }

  void recompute(const Instruction& ins, Instance& inst, const SegmentShape& shape) {
    check(inst.forward_done, "recompute before forward");
    check(inst.stages_done == 0, "recompute after backward started");
    check(!shape.beside_transfers, "recomputes a segment that computes beside transfers");
    check(ins.sets != 0 && (ins.sets & ~(shape.sets | kOutput)) == 0,
          "recomputes sets the segment does not have");
    for (auto set : {kCheckpoint, kInternals, kCore})
      if (ins.sets & set)
        check(inst.sets[set] == SetState::absent || inst.sets[set] == SetState::freed,
              "recomputes a live set");
    // Each part of the segment reads what the part before it produced.
    if (ins.sets & kCheckpoint) read_input(ins);
    else if (ins.sets & kInternals) read(inst, kCheckpoint, shape);
    else if (ins.sets & kCore) read(inst, kInternals, shape);
    produce(inst, ins.sets & ~kOutput);
    if (ins.sets & kOutput) {
      for (auto set : {kCheckpoint, kInternals, kCore}) read(inst, set, shape);
      write_output(ins);
      inst.output_recomputed = true;
    }
  }

  void backward(const Instruction& ins, Instance& inst, const SegmentShape& shape) {
    check(inst.forward_done, "backward before forward");
    check(inst.stages_done == ins.stage, "backward stage out of order");
    check(ins.stage < shape.backward_stages, "no such backward stage");
    for (auto set : {kCheckpoint, kInternals, kCore}) read(inst, set, shape);
    read_other_sets(ins, shape);
    if (ins.stage == 0 && shape.output_to_peer) {
      check_received(inst.gradient_receive, "the gradient of the segment's output");
    } else if (ins.stage == 0 && ins.segment + 1 < num_segments()) {
      const Instance& next = instance(ins.batch, ins.segment + 1, ins.micro_batch, ins.sub_batch);
      check(next.stages_done == shape_of(program_, ins.segment + 1).backward_stages,
            "the following segment's backward has not finished");
      // The gradient this stage reads comes from the backward collective of the following
      // segment, or of the one after a segment that computes beside it.
      if (!shape.beside_transfers) {
        int producer = ins.segment + 1;
        if (shape_of(program_, producer).beside_transfers) ++producer;
        const Instance& from = instance(ins.batch, producer, ins.micro_batch, ins.sub_batch);
        check(!shape_of(program_, producer).has_backward_collective ||
                  from.backward_collective == CollState::waited,
              "reads a backward collective that was not waited on");
      }
    }
    if (ins.stage == 0 && ins.segment + 1 == num_segments())
      check(inst.forward_done, "backward before the loss");
    if (ins.stage == 1 && shape.has_backward_collective)
      check(inst.backward_collective == CollState::waited,
            "stage 1 before its backward collective completed");
    check(!ins.input_only || shape.has_weight_part,
          "an input-only backward of a segment without a weight part");
    if (ins.stage > 0)
      check(inst.input_only == ins.input_only,
            "the backward stages of the instance disagree on input-only");
    inst.input_only = ins.input_only;
    inst.stages_done = ins.stage + 1;
  }

  void backward_weight(const Instruction& ins, Instance& inst, const SegmentShape& shape) {
    check(ins.stage == 0, "BackwardWeight names a stage");
    check(shape.has_weight_part, "the segment has no weight part");
    check(!inst.weight_done, "weight part twice");
    check(inst.input_only && inst.stages_done == shape.backward_stages,
          inst.input_only || inst.stages_done == 0
              ? "weight part before the instance's input-only backward has finished"
              : "weight part of an instance whose backward was whole");
    for (auto set : {kCheckpoint, kInternals, kCore}) read(inst, set, shape);
    read_other_sets(ins, shape);
    inst.weight_done = true;
  }

  // ---- Collectives of the segments.

  void start_collective(const Instruction& ins, Instance& inst, const SegmentShape& shape) {
    const bool forward = ins.direction == Direction::forward;
    check(forward ? shape.has_forward_collective : shape.has_backward_collective,
          "segment has no such collective");
    if (!forward) {
      check(inst.backward_collective == CollState::none, "collective started twice");
      check(inst.stages_done >= 1, "starts before backward stage 0");
      inst.backward_collective = CollState::started;
      return;
    }
    CollState& state = ins.replay ? inst.replayed_collective : inst.forward_collective;
    check(state == CollState::none, "collective started twice");
    check(ins.replay ? inst.output_recomputed : inst.forward_done,
          "starts before its input was computed");
    Port& port = port_of(ins);
    check(port.segment == ins.segment && port.micro_batch == ins.micro_batch &&
              port.batch == ins.batch && port.state == PortState::written,
          "the collective buffer does not hold this segment's output");
    port.state = PortState::in_flight;
    state = CollState::started;
  }

  void wait_collective(const Instruction& ins, Instance& inst) {
    const bool forward = ins.direction == Direction::forward;
    CollState& state = !forward ? inst.backward_collective
                       : ins.replay ? inst.replayed_collective
                                    : inst.forward_collective;
    check(state == CollState::started, "wait without a start");
    state = CollState::waited;
    if (forward) port_of(ins).state = PortState::reduced;
  }

  // ---- Tensor sets: frees, encodings, partitions.

  void free_sets(const Instruction& ins, Instance& inst, const SegmentShape& shape) {
    check(ins.sets != 0 && (ins.sets & ~shape.sets) == 0, "frees sets the segment does not have");
    for (auto set : {kCheckpoint, kInternals, kCore}) {
      if (!(ins.sets & set)) continue;
      check(inst.sets[set] != SetState::gathering,
            fmt::format("frees {} while its GatherSets is in flight", ops::tensor_sets_name(set)));
      check(inst.sets[set] == SetState::live || inst.sets[set] == SetState::encoded ||
                inst.sets[set] == SetState::partitioned,
            fmt::format("frees {}, which is not live", ops::tensor_sets_name(set)));
      inst.sets[set] = SetState::freed;
    }
    check_no_pending_weight_reader(ins);
  }

  void encode_or_decode(const Instruction& ins, Instance& inst, const SegmentShape& shape) {
    const bool encode = ins.op == Op::encode;
    check(ins.sets != 0 && (ins.sets & ~shape.sets) == 0,
          encode ? "encodes sets the segment does not have"
                 : "decodes sets the segment does not have");
    for (auto set : {kCheckpoint, kInternals, kCore}) {
      if (!(ins.sets & set)) continue;
      const SetState from = encode ? SetState::live : SetState::encoded;
      const std::string name = ops::tensor_sets_name(set);
      check(inst.sets[set] == from,
            encode ? fmt::format("encodes {}, which is not live or already encoded", name)
                   : fmt::format("decodes {}, which is not encoded", name));
      inst.sets[set] = encode ? SetState::encoded : SetState::live;
    }
  }

  // Partition, GatherSets, WaitSets: a replicated checkpoint goes live -> partitioned ->
  // gathering -> live, and only along those moves.
  void partition_instruction(const Instruction& ins, Instance& inst, const SegmentShape& shape) {
    check(ins.sets == kCheckpoint, "partitions, gathers or waits for sets other than the checkpoint");
    check(shape.checkpoint_replicated && shape.collective_ranks > 1,
          "partitions the checkpoint of a segment whose checkpoint is not replicated over a "
          "group of ranks (SegmentShape::checkpoint_replicated)");
    SetState& state = inst.sets[kCheckpoint];
    switch (ins.op) {
      case Op::partition:
        check(state == SetState::live, "partitions the checkpoint, which is not live and whole");
        state = SetState::partitioned;
        break;
      case Op::gather_sets:
        check(state == SetState::partitioned, "gathers the checkpoint, which is not partitioned");
        state = SetState::gathering;
        break;
      default:
        check(state == SetState::gathering,
              "waits for the checkpoint, which no GatherSets is gathering");
        state = SetState::live;
        break;
    }
  }

  // A Free of a segment's sets while a deferred weight part that reads them is still to run.
  void check_no_pending_weight_reader(const Instruction& ins) {
    for (int t = ins.segment; t < num_segments(); ++t) {
      const SegmentShape& reader = shape_of(program_, t);
      if (!reader.has_weight_part) continue;
      const bool reads = t == ins.segment ||
                         std::find(reader.reads_sets_of.begin(), reader.reads_sets_of.end(),
                                   ins.segment) != reader.reads_sets_of.end();
      const Instance& inst = instance(ins.batch, t, ins.micro_batch, ins.sub_batch);
      if (reads && inst.input_only && !inst.weight_done)
        fail(fmt::format("frees {} of segment {}, which the pending weight part of segment {} "
                         "({}) still reads",
                         ops::tensor_sets_name(ins.sets), ins.segment, t, reader.name));
    }
  }

  // ---- Reads and writes of an instance's data.

  void produce(Instance& inst, TensorSets sets) {
    for (auto set : {kCheckpoint, kInternals, kCore})
      if (sets & set) inst.sets[set] = SetState::live;
  }
  void read(Instance& inst, ops::TensorSet set, const SegmentShape& shape) {
    if (!(shape.sets & set)) return;
    const SetState state = inst.sets[set];
    check(state != SetState::freed,
          fmt::format("reads {} of segment {} after it was freed", ops::tensor_sets_name(set),
                      shape.name));
    check(state != SetState::encoded,
          fmt::format("reads {} of segment {} while it is encoded", ops::tensor_sets_name(set),
                      shape.name));
    check(state != SetState::partitioned && state != SetState::gathering,
          fmt::format("reads {} of segment {} while it is partitioned{}",
                      ops::tensor_sets_name(set), shape.name,
                      state == SetState::gathering ? " (its GatherSets was not waited)" : ""));
    check(state == SetState::live,
          fmt::format("reads {} of segment {} before it was computed", ops::tensor_sets_name(set),
                      shape.name));
  }
  // Sets of earlier segments this segment reads (SegmentShape::reads_sets_of).
  void read_other_sets(const Instruction& ins, const SegmentShape& shape) {
    for (std::size_t i = 0; i < shape.reads_sets_of.size(); ++i) {
      const int owner = shape.reads_sets_of[i];
      check(owner >= 0 && owner < ins.segment,
            "reads the sets of a segment that does not precede it");
      const SegmentShape& owner_shape = shape_of(program_, owner);
      for (auto set : {kCheckpoint, kInternals, kCore})
        if (shape.sets_read_of(i) & set)
          read(instance(ins.batch, owner, ins.micro_batch, ins.sub_batch), set, owner_shape);
    }
  }
  // A segment's epilogue reads the previous segment's reduced output and its checkpoint; the
  // first segment of a chunk after a cut reads what it received instead.
  void read_input(const Instruction& ins) {
    if (shape_of(program_, ins.segment).input_from_peer) {
      check_received(
          instance(ins.batch, ins.segment, ins.micro_batch, ins.sub_batch).activation_receive,
          "the input activation");
      return;
    }
    if (ins.segment == 0) return;
    const SegmentShape& previous = shape_of(program_, ins.segment - 1);
    // A segment that computes beside transfers passes the output before it through.
    const int producer = previous.beside_transfers ? ins.segment - 2 : ins.segment - 1;
    Port& port = port_of(ins);
    check(
        port.segment == producer && port.micro_batch == ins.micro_batch && port.batch == ins.batch,
        "the previous segment's output is not in the collective buffer");
    check(port.state == (shape_of(program_, producer).has_forward_collective ? PortState::reduced
                                                                             : PortState::written),
          "reads a forward collective that was not waited on");
    read(instance(ins.batch, ins.segment - 1, ins.micro_batch, ins.sub_batch), kCheckpoint,
         previous);
    if (const int residual = shape_of(program_, ins.segment).residual_of; residual >= 0) {
      check(residual < ins.segment, "reads the residual of a segment that does not precede it");
      read(instance(ins.batch, residual, ins.micro_batch, ins.sub_batch), kCheckpoint,
           shape_of(program_, residual));
    }
  }
  void write_output(const Instruction& ins) {
    Port& port = port_of(ins);
    check(port.state != PortState::in_flight, "overwrites a collective buffer in flight");
    port = {ins.segment, ins.micro_batch, PortState::written, ins.batch};
  }

  // ---- The step's own instructions: reductions, the optimizer step, parameters.

  void reduce_grads(const Instruction& ins) {
    check(ins.segment == -1, "ReduceGrads names a segment (its bucket goes in `bucket`)");
    const int bucket = ins.bucket;
    // The bucket is final once every segment from its ready segment on has finished backward
    // on every instance.
    int ready = -1;
    for (int s = 0; s < num_segments(); ++s)
      if (shape_of(program_, s).ready_bucket == bucket) ready = s;
    check(ready >= 0, "no segment makes this bucket final");
    check(!reduced_.contains({ins.batch, bucket}), "bucket reduced twice");
    for (int s = ready; s < num_segments(); ++s)
      for (int mb = 0; mb < spec_.micro_batches; ++mb)
        for (int sb = 0; sb < spec_.sub_batches; ++sb) {
          const Instance& inst = instance(ins.batch, s, mb, sb);
          check(inst.stages_done == shape_of(program_, s).backward_stages,
                fmt::format("bucket {} is not final: segment {} mb {} sb {} has not finished "
                            "backward", bucket, s, mb, sb));
          check(!inst.input_only || inst.weight_done,
                fmt::format("bucket {} is not final: the weight part of segment {} mb {} sb {} "
                            "has not run", bucket, s, mb, sb));
        }
    reduced_.insert({ins.batch, bucket});
  }
  void optimizer_step(int batch) {
    check(spec_.training, "optimizer step in a forward-only schedule");
    for (int s = 0; s < num_segments(); ++s) {
      const int bucket = shape_of(program_, s).ready_bucket;
      if (bucket >= 0)
        check(reduced_.contains({batch, bucket}), fmt::format("bucket {} never reduced", bucket));
    }
    check(!stepped_.contains(batch), "a second optimizer step of the batch");
    check(batch == 0 || !stepped_.contains(0), "the optimizer steps of the batches out of order");
    stepped_.insert(batch);
    weights_of_batch_ = kNoWeights;  // the update rewrote the newest version in place
  }
  // GatherParams, WaitParams, ReleaseParams: a bucket goes sharded -> gathering -> gathered ->
  // sharded, and only along those moves.
  void parameter_instruction(const Instruction& ins) {
    check(spec_.sharded_params || spec_.deferred_param_gather,
          "a parameter instruction in a schedule without sharded parameters "
          "(ScheduleSpec::sharded_params)");
    check(!spec_.deferred_param_gather || ins.op != Op::release_params,
          "releases parameters under deferred gathers (ScheduleSpec::deferred_param_gather), "
          "which keep every bucket whole");
    check(ins.bucket >= 0, "a parameter instruction needs a bucket (>= 0)");
    Instruction plain{ins.op};
    plain.bucket = ins.bucket;
    check(ins == plain,
          "a parameter instruction names its bucket alone (segment -1, every other field at its "
          "default)");
    const int bucket = ins.bucket;
    ParamState& state = parameters_[bucket];
    switch (ins.op) {
      case Op::gather_params:
        check(state == ParamState::sharded,
              fmt::format("gathers bucket {}, which is {}", bucket,
                          state == ParamState::gathering ? "already being gathered"
                                                         : "already gathered"));
        state = ParamState::gathering;
        break;
      case Op::wait_params:
        check(state == ParamState::gathering,
              fmt::format("waits for bucket {}, which no GatherParams is gathering ({})", bucket,
                          state == ParamState::gathered ? "already gathered" : "sharded"));
        state = ParamState::gathered;
        break;
      default:
        check(state == ParamState::gathered,
              fmt::format("releases bucket {}, which is not gathered ({})", bucket,
                          state == ParamState::gathering ? "its gather was not waited"
                                                         : "sharded"));
        state = ParamState::sharded;
        break;
    }
  }
  // Compute reads the parameters of every bucket its segment names, which must be gathered.
  void check_parameters_gathered(const SegmentShape& shape) const {
    for (int bucket : shape.param_buckets) {
      const auto it = parameters_.find(bucket);
      const ParamState state = it == parameters_.end() ? ParamState::sharded : it->second;
      check(state == ParamState::gathered,
            fmt::format("computes on sharded parameters of bucket {}{}", bucket,
                        state == ParamState::gathering ? " (its GatherParams was not waited)"
                                                       : ""));
    }
  }

  // ---- Point-to-point messages at chunk boundaries.

  // Sending an activation reads the output from the sub-batch's collective buffer, as the next
  // segment's epilogue would.
  void send(const Instruction& ins, Instance& inst, const SegmentShape& shape) {
    check_message_fields(ins);
    if (ins.payload == Payload::activation) {
      check(shape.output_to_peer, "sends an activation from a segment that is not output_to_peer");
      check(!inst.activation_sent, "sends the activation twice");
      check(inst.forward_done, "sends the output before the segment's Forward");
      const Port& port = port_of(ins);
      check(port.segment == ins.segment && port.micro_batch == ins.micro_batch &&
                port.batch == ins.batch,
            "the segment's output is no longer in the collective buffer");
      check(port.state == (shape.has_forward_collective ? PortState::reduced : PortState::written),
            "sends an output whose forward collective was not waited on");
      inst.activation_sent = true;
    } else {
      check(shape.input_from_peer, "sends a gradient from a segment that is not input_from_peer");
      check(!inst.gradient_sent, "sends the input gradient twice");
      check(inst.stages_done == shape.backward_stages,
            "sends the input gradient before the segment's last backward stage");
      inst.gradient_sent = true;
    }
  }
  // RecvStart: the buffer of the instance's receive is posted; nothing in it is usable yet.
  void post_receive(std::size_t index, const Instruction& ins, Instance& inst,
                    const SegmentShape& shape) {
    check_message_fields(ins);
    const bool activation = ins.payload == Payload::activation;
    if (activation)
      check(shape.input_from_peer,
            "receives an activation for a segment that is not input_from_peer");
    else
      check(shape.output_to_peer, "receives a gradient for a segment that is not output_to_peer");
    Receive& receive = activation ? inst.activation_receive : inst.gradient_receive;
    check(receive.state == ReceiveState::none,
          fmt::format("posts the {} receive twice (first at instruction {})",
                      activation ? "activation" : "gradient", receive.posted_at));
    receive = {ReceiveState::posted, index, replaying_, ins};
  }
  // RecvWait: the receive posted with the same fields has arrived.
  void wait_receive(const Instruction& ins, Instance& inst) {
    check_message_fields(ins);
    const bool activation = ins.payload == Payload::activation;
    Receive& receive = activation ? inst.activation_receive : inst.gradient_receive;
    check(receive.state != ReceiveState::arrived, "waits for a receive twice");
    check(receive.state == ReceiveState::posted, "waits for a receive that was never posted");
    check(receive.post.peer == ins.peer && receive.post.slot == ins.slot &&
              receive.post.chunk == ins.chunk,
          fmt::format("waits for a receive other than the one posted at instruction {} ({})",
                      receive.posted_at, to_string(receive.post)));
    if (!activation)
      check(inst.activation_sent, "receives the gradient of an output it has not sent");
    receive.state = ReceiveState::arrived;
  }
  // What a receive carries is usable from its RecvWait on.
  void check_received(const Receive& receive, const std::string& what) const {
    check(receive.state != ReceiveState::posted,
          fmt::format("reads {} before the RecvWait of its receive (posted at instruction {})",
                      what, receive.posted_at));
    check(receive.state == ReceiveState::arrived, what + " was not received");
  }
  void check_message_fields(const Instruction& ins) const {
    check(ins.peer >= 0, "a message needs a peer (>= 0)");
    check(ins.slot >= 0, "a message needs a slot (>= 0)");
    check(spec_.training || ins.payload == Payload::activation,
          "a gradient message in a forward-only schedule");
  }
  // A segment belongs to one chunk; its neighbours share it unless a chunk boundary lies between
  // them, where the chunk changes.
  void check_chunk(const Instruction& ins) {
    int& chunk = chunk_of_[static_cast<std::size_t>(ins.segment)];
    if (chunk >= 0) {
      if (chunk != ins.chunk)
        fail(fmt::format("segment {} belongs to chunk {} in earlier instructions", ins.segment,
                         chunk));
      return;
    }
    for (const int neighbour : {ins.segment - 1, ins.segment + 1}) {
      if (neighbour < 0 || neighbour >= num_segments()) continue;
      const int neighbour_chunk = chunk_of_[static_cast<std::size_t>(neighbour)];
      if (neighbour_chunk < 0) continue;
      const bool cut = shape_of(program_, std::min(neighbour, ins.segment)).output_to_peer;
      if (cut == (neighbour_chunk == ins.chunk))
        fail(fmt::format("segment {} is in chunk {}, which must {} the chunk of segment {} ({})",
                         ins.segment, ins.chunk, cut ? "differ from" : "equal", neighbour,
                         neighbour_chunk));
    }
    chunk = ins.chunk;
  }

  // ---- The end of the schedule.

  void finish() {
    at("at the end of the schedule", schedule_, schedule_.size());
    // First, as the most specific reason an instance is incomplete.
    for (const auto& [key, inst] : instances_) {
      const auto [batch, segment, mb, sb] = key;
      for (const Receive* receive : {&inst.activation_receive, &inst.gradient_receive}) {
        if (receive->state != ReceiveState::posted) continue;
        mark(receive->posted_earlier ? carry_.earlier : schedule_, receive->posted_at);
        fail(fmt::format("{}segment {} mb {} sb {}: the receive posted at instruction {} ({}) "
                         "was never waited",
                         batch ? "batch -1 " : "", segment, mb, sb, receive->posted_at,
                         to_string(receive->post)));
      }
    }
    for (const auto& [key, inst] : instances_) finish_instance(key, inst);
    finish_step();
  }

  void finish_instance(const std::tuple<int, int, int, int>& key, const Instance& inst) const {
    const auto [batch, segment, mb, sb] = key;
    const std::string who =
        fmt::format("{}segment {} mb {} sb {}", batch ? "batch -1 " : "", segment, mb, sb);
    const SegmentShape& shape = shape_of(program_, segment);
    check(inst.forward_done, who + ": never ran forward");
    check(!shape.output_to_peer || inst.activation_sent, who + ": its output was never sent");
    if (batch == 0 && carried_out_.contains(mb)) {
      check(carry_.steps_later, who + ": carried out, but the batch's optimizer step runs here");
      check(inst.stages_done == 0, who + ": carried out, but its backward began");
      check(inst.forward_collective != CollState::started &&
                inst.replayed_collective != CollState::started,
            who + ": a collective was never waited on");
      return;
    }
    const bool sent_later = batch == 0 && std::ranges::find(carry_.gradient_sent_later, mb) !=
                                              carry_.gradient_sent_later.end();
    if (spec_.training)
      check(!shape.input_from_peer || inst.gradient_sent != sent_later,
            who + (sent_later ? ": declared to send its input gradient later, but sent it"
                              : ": the gradient of its input was never sent"));
    check(inst.forward_collective != CollState::started &&
              inst.replayed_collective != CollState::started &&
              inst.backward_collective != CollState::started,
          who + ": a collective was never waited on");
    for (auto set : {kCheckpoint, kInternals, kCore}) {
      const SetState state = inst.sets.contains(set) ? inst.sets.at(set) : SetState::absent;
      check(state != SetState::gathering,
            fmt::format("{}: the GatherSets of its {} was never waited", who,
                        ops::tensor_sets_name(set)));
      check(state != SetState::live && state != SetState::partitioned,
            fmt::format("{}: {} is still live", who, ops::tensor_sets_name(set)));
    }
    if (spec_.training)
      check(inst.stages_done == shape.backward_stages, who + ": backward incomplete");
    check(!inst.input_only || inst.weight_done, who + ": its weight part never ran");
  }

  // What the whole step must have done: parameters back in their resting state, every instance
  // run, and the batches' optimizer steps.
  void finish_step() const {
    for (const auto& [bucket, state] : parameters_)
      check(state == (spec_.deferred_param_gather ? ParamState::gathered : ParamState::sharded),
            fmt::format("bucket {} is not {} at the end ({})", bucket,
                        spec_.deferred_param_gather ? "gathered" : "sharded",
                        state == ParamState::gathering ? "its GatherParams was never waited"
                                                       : "gathered and never released"));
    const std::size_t batches = carry_.earlier.empty() ? 1 : 2;
    const std::size_t expected = batches * program_.segments.size() *
                                 static_cast<std::size_t>(spec_.micro_batches * spec_.sub_batches);
    check(instances_.size() == expected, "some instance never ran forward");
    if (!spec_.training) return;
    if (!carry_.earlier.empty()) check(stepped_.contains(-1), "no optimizer step of batch -1");
    if (!carry_.steps_later) check(stepped_.contains(0), "no optimizer step");
    else check(!stepped_.contains(0), "an optimizer step of a batch whose step runs later");
  }

  // ---- Where the verifier is, spelled out only when a check fails.

  int num_segments() const { return static_cast<int>(program_.segments.size()); }
  // Outside any list (the program's own checks): the message names `place` alone.
  void at(const char* place) {
    where_place_ = place;
    where_instruction_ = nullptr;
    where_list_ = nullptr;
  }
  // At position `index` of `list` (the schedule or the earlier runs' list; the list's size: its
  // end): the message names the instruction there, if any, and the grid marks it.
  void at(const char* place, const Schedule& list, std::size_t index) {
    where_place_ = place;
    where_index_ = index;
    where_instruction_ = index < list.size() ? &list[index] : nullptr;
    mark(list, index);
  }
  // Which cell the grid of a rejection marks, without changing what the message names.
  void mark(const Schedule& list, std::size_t index) {
    where_list_ = &list;
    mark_index_ = index;
  }
  std::string where() const {
    if (where_instruction_ == nullptr) return where_place_;
    return fmt::format("{}{} ({})", where_place_, where_index_, to_string(*where_instruction_));
  }
  std::string grid() const {
    if (where_list_ == nullptr) return "";
    GridOptions options;
    options.column_names = {where_list_ == &schedule_ ? "this rank" : "earlier runs"};
    return format_grid({*where_list_}, {{0, mark_index_}}, options);
  }
  void check(bool ok, std::string_view what) const {
    if (!ok) [[unlikely]]
      reject(fmt::format("schedule rejected: {}: {}", where(), what), grid());
  }
  [[noreturn]] void fail(std::string_view what) const {
    reject(fmt::format("schedule rejected: {}: {}", where(), what), grid());
  }

  Instance& instance(int batch, int segment, int mb, int sb) {
    return instances_[{batch, segment, mb, sb}];
  }
  // The slots of the instruction's micro-batch lane and sub-batch (slot_lanes).
  Port& port_of(const Instruction& ins) {
    return ports_[{ins.micro_batch % slot_lanes_, ins.sub_batch}];
  }

  const Program& program_;
  const ScheduleSpec& spec_;
  const Schedule& schedule_;
  const RunCarry& carry_;
  const char* where_place_ = "";
  std::size_t where_index_ = 0;
  const Instruction* where_instruction_ = nullptr;
  const Schedule* where_list_ = nullptr;  // what the grid of a rejection shows; null: none
  std::size_t mark_index_ = 0;
  std::vector<int> chunk_of_;  // per segment; -1 until an instruction names it
  std::set<int> carried_out_;
  std::map<std::tuple<int, int, int, int>, Instance> instances_;  // (batch, segment, mb, sb)
  int slot_lanes_ = 1;
  std::map<std::pair<int, int>, Port> ports_;  // by (lane, sub-batch)
  std::set<std::pair<int, int>> reduced_;  // (batch, bucket)
  std::set<int> stepped_;                  // batches whose optimizer step has run
  std::map<int, ParamState> parameters_;   // by bucket; absent: sharded
  bool replaying_ = false;
  static constexpr int kNoWeights = 2;  // no batch's version is known to be in use
  int weights_of_batch_ = kNoWeights;  // whose weights compute instructions now run on
};

}  // namespace

void verify_schedule(const Program& program, const ScheduleSpec& spec, const Schedule& schedule,
                     const RunCarry& carry) {
  Verifier(program, spec, schedule, carry).run();
}

void verify_collective_order(const std::vector<Schedule>& schedules_of_group) {
  if (schedules_of_group.empty()) return;
  // Each rank's Starts, in order: the grid of a rejection shows these, one row per collective.
  std::vector<Schedule> orders;
  for (const Schedule& schedule : schedules_of_group) {
    Schedule& order = orders.emplace_back();
    for (const Instruction& ins : schedule)
      if (ins.op == Op::start) order.push_back(ins);
  }
  const auto grid = [&](std::size_t rank, std::size_t collective) {
    GridOptions options;
    options.row_name = "collective";
    return format_grid(orders, {{0, collective}, {rank, collective}}, options);
  };
  const Schedule& reference = orders.front();
  for (std::size_t rank = 1; rank < orders.size(); ++rank) {
    const Schedule& order = orders[rank];
    const std::size_t common = std::min(order.size(), reference.size());
    for (std::size_t i = 0; i < common; ++i)
      if (order[i] != reference[i])
        reject(fmt::format("schedule rejected: collective {} of rank {} is {} but rank 0 issues {}",
                           i, rank, to_string(order[i]), to_string(reference[i])),
               grid(rank, i));
    if (order.size() != reference.size())
      reject(fmt::format("schedule rejected: rank {} issues {} collectives, rank 0 issues {}", rank,
                         order.size(), reference.size()),
             grid(rank, common));
  }
}

namespace {

// One instruction of one rank, as error messages name it.
struct Position {
  int rank;
  std::size_t index;
};
std::string describe(const std::vector<Schedule>& schedules, Position at) {
  return fmt::format("rank {} instruction {} ({})", at.rank, at.index,
                     to_string(schedules[static_cast<std::size_t>(at.rank)][at.index]));
}
// The group's schedules side by side around the positions a rejection names.
std::string grid_at(const std::vector<Schedule>& schedules, const std::vector<Position>& at) {
  std::vector<GridMark> marks;
  for (const Position& position : at)
    marks.push_back({static_cast<std::size_t>(position.rank), position.index});
  return format_grid(schedules, marks);
}

// Whether a Recv can take what a Send carries: the same message, one chunk along the model
// (activations flow to the next chunk, gradients back to the previous one).
bool messages_match(const Instruction& send, const Instruction& receive) {
  const int step = send.payload == Payload::activation ? 1 : -1;
  return send.payload == receive.payload && send.micro_batch == receive.micro_batch &&
         send.sub_batch == receive.sub_batch && send.slot == receive.slot &&
         receive.chunk == send.chunk + step;
}

// Positions of the Sends from a to b and of the RecvStarts at b from a, keyed by (a, b), in
// the order of their ranks' lists. Rejects a peer outside the group or the rank itself.
struct MessageLists {
  std::map<std::pair<int, int>, std::vector<std::size_t>> sends, receives;
};
MessageLists message_lists(const std::vector<Schedule>& schedules) {
  const int ranks = static_cast<int>(schedules.size());
  MessageLists lists;
  for (int rank = 0; rank < ranks; ++rank) {
    const Schedule& schedule = schedules[static_cast<std::size_t>(rank)];
    for (std::size_t i = 0; i < schedule.size(); ++i) {
      const Instruction& ins = schedule[i];
      if (!is_point_to_point(ins.op)) continue;
      if (ins.peer < 0 || ins.peer >= ranks || ins.peer == rank)
        reject(fmt::format("schedule rejected: {} names peer {}, {}", describe(schedules, {rank, i}),
                           ins.peer,
                           ins.peer == rank ? "itself"
                                            : fmt::format("outside the group of {} ranks", ranks)),
               grid_at(schedules, {{rank, i}}));
      if (ins.op == Op::send) lists.sends[{rank, ins.peer}].push_back(i);
      else if (ins.op == Op::recv) lists.receives[{ins.peer, rank}].push_back(i);
    }
  }
  return lists;
}

// Pairs the i-th Send from `from` to `to` with the i-th RecvStart at `to` from `from`, noting
// each one's partner in `partner`.
void pair_messages(const std::vector<Schedule>& schedules, int from, int to,
                   const std::vector<std::size_t>& sent, const std::vector<std::size_t>& received,
                   std::vector<std::vector<std::size_t>>& partner) {
  const Schedule& sender = schedules[static_cast<std::size_t>(from)];
  const Schedule& receiver = schedules[static_cast<std::size_t>(to)];
  const std::size_t common = std::min(sent.size(), received.size());
  for (std::size_t k = 0; k < common; ++k) {
    if (!messages_match(sender[sent[k]], receiver[received[k]]))
      reject(fmt::format("schedule rejected: message {} from rank {} to rank {} does not match: "
                         "{} meets {}; both must name the same payload, micro-batch, sub-batch "
                         "and slot, an activation going to the next chunk and a gradient to the "
                         "previous one",
                         k, from, to, describe(schedules, {from, sent[k]}),
                         describe(schedules, {to, received[k]})),
             grid_at(schedules, {{from, sent[k]}, {to, received[k]}}));
    partner[static_cast<std::size_t>(from)][sent[k]] = received[k];
    partner[static_cast<std::size_t>(to)][received[k]] = sent[k];
  }
  if (sent.size() == received.size()) return;
  const Position unpaired = sent.size() > common ? Position{from, sent[common]}
                                                 : Position{to, received[common]};
  reject(fmt::format("schedule rejected: rank {} sends {} messages to rank {}, which receives {} "
                     "from rank {}; the first without a partner is {}",
                     from, sent.size(), to, received.size(), from, describe(schedules, unpaired)),
         grid_at(schedules, {unpaired}));
}

// A RecvWait waits for the receive its rank posted last with the same fields: its partner is
// that receive's Send.
void pair_receive_waits(const std::vector<Schedule>& schedules,
                        std::vector<std::vector<std::size_t>>& partner) {
  for (std::size_t rank = 0; rank < schedules.size(); ++rank) {
    const Schedule& schedule = schedules[rank];
    std::map<std::tuple<Payload, int, int, int>, std::size_t> posted;  // (payload, s, mb, sb)
    for (std::size_t i = 0; i < schedule.size(); ++i) {
      const Instruction& ins = schedule[i];
      const auto key = std::tuple{ins.payload, ins.segment, ins.micro_batch, ins.sub_batch};
      if (ins.op == Op::recv) posted[key] = i;
      if (ins.op != Op::recv_wait) continue;
      const auto post = posted.find(key);
      const Position at{static_cast<int>(rank), i};
      if (post == posted.end() || schedule[post->second].peer != ins.peer)
        reject(fmt::format("schedule rejected: {} waits for a receive the rank never posted",
                           describe(schedules, at)),
               grid_at(schedules, {at}));
      partner[rank][i] = partner[rank][post->second];
      posted.erase(post);
    }
  }
}

// Pairs every Send with its RecvStart (the i-th from a to b with the i-th at b from a) and
// returns, per rank and instruction, the partner's instruction index (on rank `peer`); a
// RecvWait's partner is the Send of the receive it waits for.
std::vector<std::vector<std::size_t>> match_messages(const std::vector<Schedule>& schedules) {
  MessageLists lists = message_lists(schedules);
  std::vector<std::vector<std::size_t>> partner(schedules.size());
  for (std::size_t rank = 0; rank < schedules.size(); ++rank)
    partner[rank].resize(schedules[rank].size());
  std::set<std::pair<int, int>> pairs;
  for (const auto& [pair, positions] : lists.sends) pairs.insert(pair);
  for (const auto& [pair, positions] : lists.receives) pairs.insert(pair);
  for (const auto& [from, to] : pairs)
    pair_messages(schedules, from, to, lists.sends[{from, to}], lists.receives[{from, to}],
                  partner);
  pair_receive_waits(schedules, partner);
  return partner;
}

}  // namespace

void verify_point_to_point(const std::vector<Schedule>& schedules_of_group) {
  const std::vector<Schedule>& schedules = schedules_of_group;
  const std::vector<std::vector<std::size_t>> partner = match_messages(schedules);
  // Rendezvous run: a rank runs freely (RecvStart included) up to a Send whose partner's
  // RecvStart it has not yet passed, or a RecvWait whose partner's Send has not been passed,
  // and waits there; a rank passing a message instruction wakes its peer. Each rank passes
  // each of its instructions once and is woken at most once per message instruction of a peer.
  const std::size_t ranks = schedules.size();
  std::vector<std::size_t> position(ranks, 0);
  std::vector<int> runnable(ranks);
  for (std::size_t rank = 0; rank < ranks; ++rank) runnable[rank] = static_cast<int>(rank);
  const auto passed = [&](std::size_t rank, std::size_t index) { return position[rank] > index; };
  while (!runnable.empty()) {
    const auto rank = static_cast<std::size_t>(runnable.back());
    runnable.pop_back();
    const Schedule& schedule = schedules[rank];
    std::size_t& at = position[rank];
    for (; at < schedule.size(); ++at) {
      const Instruction& ins = schedule[at];
      if (!is_point_to_point(ins.op)) continue;
      const auto peer = static_cast<std::size_t>(ins.peer);
      if (ins.op != Op::recv && !passed(peer, partner[rank][at])) break;  // the peer wakes us
      // Passing a Send may release the peer's RecvWait; passing a RecvStart its Send.
      if (ins.op != Op::recv_wait) runnable.push_back(static_cast<int>(peer));
    }
  }
  // Every rank left is stuck at a Send or RecvWait whose partner lies behind another stuck
  // rank's position: together they name the cycle.
  std::string blocked;
  std::vector<Position> stuck;
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    const std::size_t at = position[rank];
    if (at == schedules[rank].size()) continue;
    stuck.push_back({static_cast<int>(rank), at});
    blocked += fmt::format("{}{} waits for {}", blocked.empty() ? "" : "; ",
                           describe(schedules, stuck.back()),
                           describe(schedules, {schedules[rank][at].peer, partner[rank][at]}));
  }
  if (!blocked.empty())
    reject(fmt::format("schedule rejected: the point-to-point messages deadlock under rendezvous "
                       "semantics (a Send waits for its RecvStart, a RecvWait for its Send): {}",
                       blocked),
           grid_at(schedules, stuck));
}

}  // namespace oases::schedule
