#include "runtime/trace.h"

#include "core/atomic_file.h"
#include "core/error.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

namespace oases::runtime {

namespace {
nlohmann::json event_array(const std::vector<TraceRecorder::Event>& recorded, int rank,
                           int pipeline_stage) {
  nlohmann::json events = nlohmann::json::array();
  const char* lane_names[] = {"compute", "communication", "optimizer", "point-to-point"};
  // The point-to-point lane is named only where there is a pipeline, so other traces keep
  // their three lanes.
  const int lanes = pipeline_stage >= 0 ? 4 : 3;
  for (int lane = 0; lane < lanes; ++lane)
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", lane},
                      {"args", {{"name", lane_names[lane]}}}});
  events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", rank},
       {"args", {{"name", "rank " + std::to_string(rank) +
                              (pipeline_stage >= 0
                                   ? fmt::format(", stage {}", pipeline_stage)
                                   : std::string())}}}});
  for (const TraceRecorder::Event& e : recorded)
    events.push_back({{"name", e.name}, {"ph", "X"}, {"pid", rank},
                      {"tid", static_cast<int>(e.lane)}, {"ts", e.start_us},
                      {"dur", e.duration_us}});
  return events;
}

void write_text(const std::string& path, const std::string& text) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  write_file_atomically(path, text);
}
}  // namespace

std::string trace_name(const InstructionRecord& record) {
  using schedule::Op;
  const schedule::Instruction& ins = record.instruction;
  const std::string segment = record.segment ? record.segment->name : std::string();
  switch (ins.op) {
    case Op::forward: return fmt::format("F {} mb{} sb{}", segment, ins.micro_batch, ins.sub_batch);
    case Op::recompute:
      return fmt::format("R {} mb{} sb{} [{}]", segment, ins.micro_batch, ins.sub_batch,
                         ops::tensor_sets_name(ins.sets));
    case Op::backward:
      return fmt::format("B{} {} mb{} sb{}", ins.stage, segment, ins.micro_batch, ins.sub_batch);
    case Op::backward_weight:
      return fmt::format("W {} mb{} sb{}", segment, ins.micro_batch, ins.sub_batch);
    case Op::start:
    case Op::wait: {
      const char* kind = record.collective == ops::CollectiveKind::all_gather       ? "AG"
                         : record.collective == ops::CollectiveKind::all_to_all     ? "A2A"
                         : record.collective == ops::CollectiveKind::reduce_scatter ? "RS"
                         : record.collective == ops::CollectiveKind::shift          ? "SHIFT"
                         : record.reduce == comm::ReduceOp::max                     ? "AR-max"
                                                                                    : "AR";
      return fmt::format("{} {}{} {} mb{} sb{}", kind,
                         ins.direction == schedule::Direction::forward ? "fwd" : "bwd",
                         ins.replay ? " replay" : "", segment, ins.micro_batch, ins.sub_batch);
    }
    case Op::gather_sets:
    case Op::wait_sets:
      return fmt::format("AG {} {} mb{} sb{}", ops::tensor_sets_name(ins.sets), segment,
                         ins.micro_batch, ins.sub_batch);
    case Op::partition:
      return fmt::format("Partition {} mb{} sb{} [{}]", segment, ins.micro_batch, ins.sub_batch,
                         ops::tensor_sets_name(ins.sets));
    case Op::free:
      return fmt::format("Free {} mb{} sb{} [{}]", segment, ins.micro_batch, ins.sub_batch,
                         ops::tensor_sets_name(ins.sets));
    case Op::encode:
    case Op::decode:
      return fmt::format("{} {} mb{} sb{} [{}]", ins.op == Op::encode ? "Encode" : "Decode",
                         segment, ins.micro_batch, ins.sub_batch, ops::tensor_sets_name(ins.sets));
    case Op::reduce_grads: return fmt::format("ReduceGrads bucket{}", ins.bucket);
    case Op::gather_params: return fmt::format("GatherParams bucket{}", ins.bucket);
    case Op::wait_params: return fmt::format("WaitParams bucket{}", ins.bucket);
    case Op::release_params: return fmt::format("ReleaseParams bucket{}", ins.bucket);
    case Op::send:
    case Op::recv:
    case Op::recv_wait:  // a receive shows where the compute lane waits for it
      return fmt::format("{} {} mb{} sb{} {} {}", ins.op == Op::send ? "Send" : "Recv",
                         ins.payload == ops::Payload::activation ? "act" : "grad",
                         ins.micro_batch, ins.sub_batch, ins.op == Op::send ? "->" : "<-",
                         ins.peer);
    case Op::optimizer_step: return "OptimizerStep";
    case Op::use_weights: return schedule::to_string(ins);
  }
  return "?";
}

void TraceRecorder::record(const InstructionRecord& r) {
  add(trace_name(r), r.lane, us_at(r.began), us_at(r.finished));
}

std::string TraceRecorder::to_json(int rank) const {
  return nlohmann::json{{"traceEvents", event_array(events_, rank, pipeline_stage_)}, {"displayTimeUnit", "ms"}}
      .dump();
}

std::string TraceRecorder::events_json(int rank) const { return event_array(events_, rank, pipeline_stage_).dump(); }

void TraceRecorder::write(const std::string& path, int rank) const { write_text(path, to_json(rank)); }

void TraceRecorder::write_merged(const std::string& path,
                                 const std::vector<std::string>& event_arrays) {
  nlohmann::json events = nlohmann::json::array();
  for (const std::string& array : event_arrays)
    for (auto& event : nlohmann::json::parse(array)) events.push_back(std::move(event));
  write_text(path, nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump());
}

}  // namespace oases::runtime
