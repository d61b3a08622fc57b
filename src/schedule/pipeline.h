// Pipeline orders: which compute step each pipeline rank runs, in order, before any lowering.
//
// A pipeline cuts the model into C = P x v chunks numbered along the model (chunk 0 takes the
// input, chunk C - 1 computes the loss). Chunk c lives on rank c % P, so rank r holds chunks
// r, r + P, r + 2P, ... (with v = 1 it holds chunk r alone). A step runs m micro-batches. An
// order is, per rank, the list of compute actions over (chunk, micro-batch) in the order the
// rank runs them; later passes lower it to instructions (schedule.h) by inserting Send/Recv,
// gradient reductions and frees. Orders say nothing about time: the dependencies below decide
// when an action can start, and sim/pipeline_sim.h prices them.
//
// Dependencies of an action on (c, mb), each on exactly one other action:
//   F(c, mb)            after F(c - 1, mb)             (none for c = 0)
//   B(c, mb), I(c, mb)  after B/I(c + 1, mb)           (after F(c, mb) for c = C - 1)
//   W(c, mb)            after I(c, mb)
// B is the whole backward of the chunk; the zero-bubble schedule splits it into I, the
// gradient with respect to the chunk's input (what the previous chunk waits for), and W, the
// gradient with respect to its weights (which nothing else waits for within the step).
//
//   kind         order on rank r (w = warm-up forwards)                       live (rank 0)
//   gpipe        F of mb 0..m-1, then B of mb 0..m-1                          m
//   1f1b         w = min(P - r - 1, m) forwards, then pairs F(w + i), B(i),   min(P, m)
//                then the remaining backwards (PipeDream-flush)
//   interleaved  Megatron-LM's order over v chunks per rank (below)           min(w0 + 1, m v)
//   zero-bubble  ZB-H1: 1F1B's order with B split into I then W; rank r       min(P, m)
//                defers the W of micro-batch i until after I(i + r), and
//                runs the deferred ones after its last I
//   2bw          1F1B's order for one step alone; across steps the stream    P
//                never drains (schedule/pipeline_2bw.h); needs m > P
//
// GPipe runs backwards in micro-batch order (as GPipe and PyTorch's ScheduleGPipe do): the
// step time is the same in either order, and micro-batch 0's gradient reaches rank 0 first.
//
// Interleaved (Megatron-LM, forward_backward_pipelining_with_interleaving): rank r runs
// m v forward and m v backward "virtual micro-batches" k = 0..m v - 1. Forward k is local chunk
// (k mod P v) / P, i.e. global chunk r + P that, on micro-batch (k / P v) P + k mod P: groups
// of P micro-batches pass through one chunk before the next chunk takes them. Backward k visits
// the local chunks in reverse (local chunk v - 1 - (k mod P v) / P) on the same micro-batches.
// Rank r first runs w_r = min((P - r - 1) 2 + (v - 1) P, m v) forwards, then pairs
// forward w_r + i, backward i, then the remaining backwards. m must be a multiple of P.
// Megatron runs every forward first when m == P, for the sake of its blocking send/recv
// pairing; the dependencies do not need it, the step time is the same, and the cap above keeps
// later ranks' memory lower, so this order uses the formula for every m.
//
// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): the I of the last chunk no
// longer waits for W, so backwards cross the pipeline at the cost of I alone; the W's that
// rank r defers fill the idle time of the cool-down. With equal F, I and W costs each rank
// idles (P - 1) per step against 3 (P - 1) for 1F1B with B = I + W, a third; live activations
// (forward run, W not yet) peak at min(P, m) on every rank, 1F1B's peak on rank 0.
//
// PipeDream-2BW (no flush, two weight versions): its orders continue 1F1B's steady state from
// one step into the next; schedule/pipeline_2bw.h lowers a step's run of that stream.
#pragma once

#include "core/named_values.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace oases::schedule {

enum class PipelineKind : std::uint8_t { gpipe, one_f_one_b, interleaved, zero_bubble, two_bw };
inline constexpr std::array<NamedValue<PipelineKind>, 5> kPipelineKindNames{{
    {PipelineKind::gpipe, "gpipe"},
    {PipelineKind::one_f_one_b, "1f1b"},
    {PipelineKind::interleaved, "interleaved"},
    {PipelineKind::zero_bubble, "zero-bubble"},
    {PipelineKind::two_bw, "2bw"},
}};
std::string_view name(PipelineKind kind);
// The names above; UserError naming `setting` (the config key, e.g. "parallel.pipeline"), the
// value found and the valid names.
PipelineKind parse_pipeline_kind(std::string_view text, std::string_view setting);

// One compute step of one chunk on one micro-batch.
struct PipelineAction {
  enum Kind : std::uint8_t {
    forward,          // F
    backward,         // B: input and weight gradients together
    backward_input,   // I: the input gradient alone (zero-bubble)
    backward_weight,  // W: the weight gradient alone (zero-bubble), after its I
  };
  Kind kind = forward;
  int chunk = 0;        // along the model, in [0, P v)
  int micro_batch = 0;  // in [0, m)
  bool operator==(const PipelineAction&) const = default;
};

struct PipelineSpec {
  PipelineKind kind = PipelineKind::one_f_one_b;
  int stages = 1;          // P: pipeline ranks
  int virtual_stages = 1;  // v: chunks per rank; > 1 only for interleaved
  int micro_batches = 1;   // m: per step

  int chunks() const { return stages * virtual_stages; }
  int rank_of_chunk(int chunk) const { return chunk % stages; }
  // zero-bubble runs I and W; every other kind runs B.
  bool splits_backward() const { return kind == PipelineKind::zero_bubble; }
};

// UserError when the spec cannot be generated: P, v and m at least 1; v > 1 only with
// interleaved, which needs v >= 2 and m a multiple of P; 2bw needs m > P. Messages
// name the setting (parallel.pp, parallel.virtual_stages, parallel.pipeline; m is the number
// of micro-batches per step), the value found and the valid values.
void check_pipeline_spec(const PipelineSpec& spec);

// orders[r]: rank r's actions in the order it runs them, r in [0, P).
using PipelineOrders = std::vector<std::vector<PipelineAction>>;

// The order of spec.kind (see the table above). Checks the spec first (UserError).
PipelineOrders pipeline_orders(const PipelineSpec& spec);

// The action `action` waits for (see the dependencies above); none for F of chunk 0.
// REQUIRES: action.chunk in [0, spec.chunks()).
std::optional<PipelineAction> pipeline_dependency(const PipelineSpec& spec,
                                                  const PipelineAction& action);

// Checks that `orders` can run as a step of `spec`:
//  - one list per rank; every action names a chunk of its own rank, a micro-batch in [0, m)
//    and a kind of spec.kind (F and B; F, I and W for zero-bubble);
//  - each rank runs, for each of its chunks and micro-batches, F once and B once (I once and
//    W once), its B/I after its F and its W after its I;
//  - across ranks, with each rank running its list in order and an action starting once its
//    dependency has run, every rank reaches its end (no cyclic wait).
// Throws InternalError naming the rank and position (index in its list) and the action: the
// first bad or repeated action, a missing one, or every blocked rank with what it waits for.
void verify_pipeline_orders(const PipelineSpec& spec, const PipelineOrders& orders);

// Per rank: the most (chunk, micro-batch) pairs whose forward has run and whose B (I for
// zero-bubble) has not, at any point of its list: the activations the rank keeps for its input
// gradients. For v = 1 these are micro-batches; an interleaved chunk holds 1/v of a rank's
// layers, so v of them weigh one micro-batch of a non-interleaved rank.
std::vector<int> max_in_flight(const PipelineOrders& orders);

// As max_in_flight, but a pair stays live until its weight gradient has run (W, or B which
// includes it): the weight gradient reads the layers' saved inputs too.
std::vector<int> max_in_flight_until_weight_gradient(const PipelineOrders& orders);

// "F(c2,mb3)", "B(...)", "I(...)", "W(...)".
std::string to_string(const PipelineAction& action);

}  // namespace oases::schedule
