// The run configuration of the engine, executor, profiler and trainer tests that build a
// TrainingEngine in process: a tiny model and a step of two micro-batches. Everything else keeps
// plan::RunConfig's defaults; a test sets the settings it is about (precision, schedule,
// recomputation, tp/dp/pp, optimizer, lr, steps, ...) on the result, where they can be read.
//
// The values are fixed: tests compare losses and memory figures computed from them.
#pragma once

#include "model/config.h"
#include "plan/run_config.h"
#include "support/tiny_model.h"

namespace oases::testing {

// A run of `model` (tiny_model() unless given) with micro-batches of 4 sequences and global
// batches of 8: two micro-batches per step at dp = 1, so gradient accumulation runs. The 16-bit
// matrix products are pinned to "convert+sgemm", which every CPU has: under bf16 and fp16 the
// engine does not measure the paths at start-up, and the numbers are the same on every
// machine (the setting does nothing in fp32 and fp64).
inline plan::RunConfig tiny_run(const model::ModelConfig& model = tiny_model()) {
  plan::RunConfig c;
  c.model = model;
  c.train.micro_batch = 4;
  c.train.global_batch = 8;
  c.train.gemm16_path = "convert+sgemm";
  return c;
}

}  // namespace oases::testing
