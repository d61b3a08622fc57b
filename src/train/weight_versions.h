// WeightVersions: the two versions of one stage's parameters that PipeDream-2BW keeps
// (schedule/pipeline_2bw.h). W(n) is the version after n optimizer steps, and W(-1) = W(0):
// batch t computes on W(t - 1) while the optimizer step of batch t - 1 makes W(t) the newest.
// The model's parameter buffer, which the segments read, holds one version and a second buffer
// of the same size the other; switching swaps their contents, so two versions cost two copies
// of the parameters, not three.
//
// Between runs the model's buffer holds the newest version W(n) and the other buffer W(n - 1),
// the version the batch in flight (or the next one) computes on: what a checkpoint saves.
#pragma once

#include "core/buffer.h"
#include "core/tensor.h"

#include <cstdint>

namespace oases::train {

class WeightVersions {
 public:
  // `model_params` (the model's flat parameter array, host memory) holds W(newest); the other
  // buffer starts as a copy of it, standing for W(newest - 1) until set_older.
  WeightVersions(const Tensor& model_params, std::int64_t newest);

  std::int64_t newest() const { return newest_; }
  // Makes the model's buffer hold W(version). REQUIRES: version is newest() or newest() - 1.
  void use(std::int64_t version);
  // Before the optimizer updates the model's buffer in place from W(n) to W(n + 1), n =
  // newest(): the model's buffer holds W(n) and the other buffer a copy of it, which W(n - 1)
  // gave way to (no batch computes on it any more). Afterwards newest() is n + 1.
  void begin_update();
  // W(newest() - 1), the version the other buffer holds once use(newest()) has run.
  const Tensor& older() const { return other_view_; }
  // Sets W(newest() - 1) (resuming): copies `values` into the other buffer.
  // REQUIRES: the model's buffer holds W(newest()).
  void set_older(const Tensor& values);

 private:
  Tensor model_;
  Buffer other_;
  Tensor other_view_;
  std::int64_t newest_;
  std::int64_t in_model_;  // the version in the model's buffer; the other one holds the other
};

}  // namespace oases::train
