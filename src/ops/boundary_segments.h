// Segments that move the residual stream between placements: a reshard between layers run at
// different tensor-parallel degrees, and the output of a pipeline stage.
//
//   ReshardSegment(l)   r_l = epilogue(layer l-1's output) on layer l-1's rows   | AG(r_l)
//                       Degree rises: the groups of layer l-1 inside one group of layer l
//                       gather their rows (forward collective). Degree falls: this rank keeps
//                       its group's rows, and in backward the groups of layer l inside one
//                       group of layer l-1 gather the gradient (backward collective). The next
//                       segment's epilogue copies the reshard slot.
//   StageOutputSegment  r = epilogue(last output of the stage), kept and sent to the next
//                       stage (Send(activation)); backward starts from the received gradient
//                       of r (Recv(gradient)) and runs the epilogue's backward. Its placement
//                       is that of the next stage's first layer: where that degree differs
//                       from the stage's last layer, a ReshardSegment precedes it and its
//                       epilogue copies the reshard slot.
#pragma once

#include "ops/context.h"
#include "ops/epilogue.h"
#include "ops/segment.h"

#include <memory>
#include <string>

namespace oases::ops {

struct ReshardSpec {
  std::string name;        // "reshard.<l>"
  Placement from, to;      // layer l-1's and layer l's placements (degrees differ)
  comm::Communicator* gather_group = nullptr;  // see above: (to, from) rising, (from, to) falling
  ResidualEpilogue epilogue;
};

struct StageOutputSpec {
  std::string name;  // "stage_output"
  Placement at;
  ResidualEpilogue epilogue;
  // Sequence parallelism: the epilogue runs on this rank's block of the tokens (as a shard
  // segment's does: ops/layer_segments.h), which is what is sent, 1/degree of r; backward
  // all-gathers the output gradient it forms for the stage's last block (stage 0, then
  // AG(output_grad), then an empty stage 1).
  bool sequence_parallel = false;
};

std::unique_ptr<Segment> make_reshard_segment(int id, const ModelContext& model, ReshardSpec spec);
std::unique_ptr<Segment> make_stage_output_segment(int id, const ModelContext& model,
                                                   StageOutputSpec spec);

}  // namespace oases::ops
