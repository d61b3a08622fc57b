// ZeRO's partition of the flat arrays: which elements of a gradient bucket each rank of the
// group that sums the bucket updates, and the FlatLayout of the parts one rank owns.
//
//   bucket [begin, end) over a group of n ranks:
//   | block 0 (rank 0) | block 1 (rank 1) | ... | block n-1 (rank n-1) |
//   ^ begin          ^ cuts[1]          ^ cuts[2]                       ^ end
//
// Blocks are contiguous and as equal as the optimizer allows: an element-wise optimizer
// (AdamW, SGD) accepts any cut, so every block holds ceil(len / n) elements but the last; a
// factored one moves each cut to the nearer end of the parameter it would split (Adafactor
// every parameter, SM3 its matrices), so its blocks hold whole parameters. Each rank's
// optimizer then owns state for its blocks alone: 1/n of the bucket's state, by construction.
//
// The owned layout keeps the flat arrays' indexing: a rank steps its parts at their own offsets
// in the whole parameter and gradient arrays, so nothing is copied in or out for the update.
#pragma once

#include "optim/flat_layout.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace oases::optim {

// Offsets cutting [begin, end) into `members` consecutive blocks: members + 1 non-decreasing
// offsets, the first begin and the last end. Block i is [cuts[i], cuts[i + 1]). A cut strictly
// inside a parameter for which accepts_cut(parameter) is false moves to that parameter's start
// or end, whichever is nearer (its end on a tie).
// REQUIRES: layout valid; 0 <= begin <= end <= layout.total_numel; members >= 1.
std::vector<std::int64_t> partition_range(const FlatLayout& layout, std::int64_t begin,
                                          std::int64_t end, int members,
                                          const std::function<bool(const ParamSlot&)>& accepts_cut);

// A range of the flat arrays one rank owns.
struct OwnedRange {
  std::int64_t begin = 0, end = 0;
};

// The layout of `whole`'s elements inside `owned` (ascending, disjoint ranges): every parameter
// wholly inside a range as it is; a parameter a range cuts as the vector of its elements in
// the range (name and weight decay as the parameter's, its trailing padding elements counted
// as padding, no split dimension), which only element-wise optimizers and SM3's vectors accept.
// Offsets and total_numel are whole's.
FlatLayout owned_layout(const FlatLayout& whole, const std::vector<OwnedRange>& owned);

}  // namespace oases::optim
