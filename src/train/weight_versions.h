// WeightVersions: the two versions of one stage's parameters that PipeDream-2BW keeps
// (schedule/pipeline_2bw.h). W(n) is the version after n optimizer steps, and W(-1) = W(0):
// batch t computes on W(t - 1) while the optimizer step of batch t - 1 makes W(t) the newest.
// The model's parameter buffer, which the segments read, holds one version and a second buffer
// of the same size the other; switching swaps their contents, so two versions cost two copies
// of the parameters, not three.
//
// Between runs the model's buffer holds the newest version W(n) and the other buffer W(n - 1),
// the version the batch in flight (or the next one) computes on: what a checkpoint saves.
//
// Under ZeRO-3 a rank holds only its blocks of each version: the versions are kept, copied and
// swapped over the `held` element ranges alone, and the rest of the second buffer reads as
// zeros and takes no memory, except while a checkpoint has gathered it whole (release_others()
// gives it back).
#pragma once

#include "core/pageable_buffer.h"
#include "core/tensor.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace oases::train {

class WeightVersions {
 public:
  using Range = std::pair<std::int64_t, std::int64_t>;  // elements [first, second)
  // `model_params` (the model's flat parameter array, host memory) holds W(newest); the other
  // buffer starts as a copy of it, standing for W(newest - 1) until set_older. `held`: the
  // element ranges kept (empty: the whole array).
  WeightVersions(const Tensor& model_params, std::int64_t newest, std::vector<Range> held = {});

  std::int64_t newest() const { return newest_; }
  // Makes the model's buffer hold W(version). REQUIRES: version is newest() or newest() - 1.
  void use(std::int64_t version);
  // Before the optimizer updates the model's buffer in place from W(n) to W(n + 1), n =
  // newest(): the model's buffer holds W(n) and the other buffer a copy of it, which W(n - 1)
  // gave way to (no batch computes on it any more). Afterwards newest() is n + 1.
  void begin_update();
  // W(newest() - 1), the version the other buffer holds once use(newest()) has run (outside the
  // held ranges: zeros, or what a gather wrote there).
  const Tensor& older() const { return other_view_; }
  // Sets W(newest() - 1) (resuming): copies `values` into the other buffer (its held ranges).
  // REQUIRES: the model's buffer holds W(newest()).
  void set_older(const Tensor& values);
  // Gives back the other buffer's memory outside the held ranges (after a checkpoint gathered
  // the older version whole there).
  void release_others();

 private:
  // Calls visit(begin, end) for each held range, in elements.
  template <class Visit>
  void for_each_held(Visit&& visit) const;
  Tensor model_;
  PageableBuffer other_;
  Tensor other_view_;
  std::vector<Range> held_;
  std::int64_t newest_;
  std::int64_t in_model_;  // the version in the model's buffer; the other one holds the other
};

}  // namespace oases::train
