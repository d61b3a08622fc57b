// Schedules side by side: a compact notation of instructions and the rank x position grid that
// the verifier's errors show around the instruction they reject, as PyTorch's pipelining
// prints its schedules (one column per rank, one row per step).
//
// Compact notation: one short cell per instruction. s is the segment and mb.sb the instance;
// upper case computes, lower case moves or waits.
//   F s.mb.sb          Forward
//   R s.mb.sb:SETS     Recompute of SETS
//   B s.mb.sb/stage    Backward stage        I s.mb.sb/stage   the same, input-only
//   W s.mb.sb          BackwardWeight
//   sf / sb / sr       Start of the forward, backward or replayed forward collective of s.mb.sb
//   wf / wb / wr       Wait of that collective
//   x s.mb.sb:SETS     Free of SETS
//   e / d s.mb.sb:SETS Encode / Decode
//   pt / gs / ws s.mb.sb:SETS  Partition / GatherSets / WaitSets
//   gp / wp / rp N     GatherParams / WaitParams / ReleaseParams of bucket N
//   rg N               ReduceGrads of bucket N
//   step               OptimizerStep
//   uw B               UseWeights of batch B
//   a s.mb.sb>P        Send of an activation to rank P (g: of a gradient)
//   sa s.mb.sb<P       RecvStart of an activation from rank P (sg: of a gradient)
//   wa s.mb.sb<P       RecvWait of that receive (wg: of a gradient)
// SETS are letters: c checkpoint, i internals, k core, o output (- for none). A trailing '
// marks an instruction of batch -1 (a no-flush pipeline's previous batch; another batch b
// other than 0 ends in 'b). Chunk, slot, encoding and fields an op does not use are left out:
// the full text (to_string) has them. Examples: F3.0.1 is Forward(seg=3, mb=0, sb=1);
// sr4.1.0 the Start of segment 4's replayed forward collective; a7.2.0>1 the Send of
// micro-batch 2's activation from segment 7 to rank 1.
#pragma once

#include "schedule/schedule.h"

#include <cstddef>
#include <string>
#include <vector>

namespace oases::schedule {

std::string compact_string(const Instruction& instruction);

// One cell of a grid: the instruction of column `column` at position `row`; a row at or past
// the end of the column's schedule marks its end.
struct GridMark {
  std::size_t column = 0;
  std::size_t row = 0;
};

struct GridOptions {
  // Column headers; "rank 0", "rank 1", ... where empty (else one per column).
  std::vector<std::string> column_names;
  std::string row_name = "pos";  // the header of the row labels
  std::size_t context = 3;       // rows shown before and after each marked row
  std::size_t width = 100;       // the longest line, in characters
};

// The schedules of `columns` side by side: one row per position, labelled by it, each cell the
// instruction's compact_string (cut to 14 characters, ending in ~ where cut). With marks, only
// the rows within options.context of a marked row are shown (a row of ... where rows are left
// out; a row labelled end where a mark lies past the last instruction of its column), each
// marked cell in [brackets] and its row flagged with >. Columns that do not fit options.width
// are left out, those farthest from a marked column first (a last line says how many). Without
// marks every row and column is shown. Each line ends in '\n'.
std::string format_grid(const std::vector<Schedule>& columns, const std::vector<GridMark>& marks,
                        const GridOptions& options = {});

}  // namespace oases::schedule
