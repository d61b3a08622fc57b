#include "sim/roofline.h"

#include "core/error.h"

#include <fmt/format.h>

namespace oases::sim {

double work_seconds(const DeviceSpec& device, const ops::Work& work, const std::string& dtype) {
  double seconds = 0;
  const auto peak = device.peak_flops.find(dtype);
  OASES_CHECK(work.matmuls.empty() || peak != device.peak_flops.end(),
              "the device {} states no peak for {} (device.peak_tflops.{}); the config's "
              "train.precision needs it",
              device.name, dtype, dtype);
  const EfficiencyCurve& gemm = device.gemm_curve(dtype);
  for (const ops::MatMul& m : work.matmuls) {
    const double flops = m.flops();
    if (flops <= 0) continue;
    seconds += device.kernel_launch_seconds +
               flops / (peak->second * gemm.at(flops) * device.step_efficiency);
  }
  if (work.bytes > 0)
    seconds += device.kernel_launch_seconds +
               work.bytes / (device.memory_bytes_per_second * device.memory_efficiency.at(work.bytes) *
                             device.step_efficiency);
  return seconds;
}

ops::Work instruction_work(const ops::Program& program, const schedule::Instruction& ins) {
  using schedule::Op;
  OASES_ASSERT(ins.segment >= 0 && static_cast<std::size_t>(ins.segment) < program.segments.size(),
               "{} names no segment of the program", schedule::to_string(ins));
  const ops::SegmentShape& shape = program.segments[static_cast<std::size_t>(ins.segment)];
  const ops::SegmentWork& work = shape.work;
  OASES_ASSERT(work.known, "segment {} does not describe its work (ops::SegmentWork)", shape.name);
  switch (ins.op) {
    case Op::forward: return work.forward();
    case Op::recompute: return work.recompute(ins.sets);
    case Op::backward: return work.backward(ins.stage, ins.input_only);
    case Op::backward_weight: return work.backward_weight;
    default: break;
  }
  OASES_ASSERT(false, "{} is not a compute instruction", schedule::to_string(ins));
  return {};
}

std::function<double(const schedule::Instruction&)> roofline_compute(const DeviceSpec& device,
                                                                     const ops::Program& program,
                                                                     const std::string& dtype) {
  return [&device, &program, dtype](const schedule::Instruction& ins) {
    return work_seconds(device, instruction_work(program, ins), dtype);
  };
}

std::function<double(const schedule::Instruction&)> roofline_codec(const DeviceSpec& device,
                                                                   const ops::Program& program) {
  if (device.memory_bytes_per_second <= 0 || device.memory_efficiency.x.empty()) return nullptr;
  return [&device, &program](const schedule::Instruction& ins) {
    ops::Work pass;
    pass.bytes =
        ops::encodable_elements(program, ins.segment, ins.sets) *
        static_cast<double>(program.set_element_bytes + ops::encoded_element_bytes(ins.encoding));
    return work_seconds(device, pass, "");
  };
}

}  // namespace oases::sim
