// Compute time on a cluster's device (sim/cluster.h) from a segment's work (ops::SegmentWork):
// each matrix product takes the kernel launch plus its FLOPs at the device's peak for the
// element type times the GEMM efficiency at its size (a batched product, count > 1, is one
// kernel whose size is all its instances together); the memory-bound kernels of a part take a
// launch plus their bytes at the memory bandwidth times the memory efficiency at that size;
// both efficiencies times the device's step_efficiency.
#pragma once

#include "ops/program.h"
#include "schedule/schedule.h"
#include "sim/cluster.h"

#include <functional>
#include <string>

namespace oases::sim {

// Seconds of `work` on `device` with products in `dtype` ("fp32", "bf16", "fp16", "fp64").
// REQUIRES: the device has a peak for dtype when the work has products (UserError naming the
// device otherwise).
double work_seconds(const DeviceSpec& device, const ops::Work& work, const std::string& dtype);

// The work of a compute instruction (Forward, Recompute, Backward, BackwardWeight) of
// `program`'s segment. REQUIRES: the segment describes its work (InternalError naming it).
ops::Work instruction_work(const ops::Program& program, const schedule::Instruction& ins);

// CostModel::compute for `program` on `device`: every compute instruction priced by its work.
// `device` and `program` must outlive the function.
std::function<double(const schedule::Instruction&)> roofline_compute(const DeviceSpec& device,
                                                                     const ops::Program& program,
                                                                     const std::string& dtype);

// CostModel::codec for `program` on `device`: an Encode reads a kept set's values and writes
// them encoded, a Decode the reverse, each one memory-bound pass at the device's bandwidth.
// Null where the device states no memory bandwidth. `device` and `program` must outlive it.
std::function<double(const schedule::Instruction&)> roofline_codec(const DeviceSpec& device,
                                                                   const ops::Program& program);

}  // namespace oases::sim
