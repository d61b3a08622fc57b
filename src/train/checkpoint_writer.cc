#include "train/checkpoint_writer.h"

#include "core/error.h"
#include "core/timer.h"

namespace oases::train {

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

StagingMemory& CheckpointWriter::staging() {
  OASES_ASSERT(!thread_.joinable(), "checkpoint staging memory reused while a save is in flight");
  return staging_;
}

void CheckpointWriter::start(StagedCheckpoint staged) {
  OASES_ASSERT(!thread_.joinable(), "a checkpoint save started while another is in flight");
  staged_ = std::move(staged);
  result_ = FinishedSave{};
  error_ = nullptr;
  done_.store(false);
  thread_ = std::thread([this] {
    try {
      const Stopwatch clock;
      result_.folder = staged_.write(
          [this](const std::string& message) { result_.messages.push_back(message); });
      result_.seconds = clock.seconds();
    } catch (...) {
      error_ = std::current_exception();
    }
    done_.store(true, std::memory_order_release);
  });
}

std::optional<FinishedSave> CheckpointWriter::poll() {
  if (!thread_.joinable() || !done_.load(std::memory_order_acquire)) return std::nullopt;
  return finish();
}

std::optional<FinishedSave> CheckpointWriter::finish() {
  if (!thread_.joinable()) return std::nullopt;
  thread_.join();
  staged_ = StagedCheckpoint{};  // the staging memory goes back at once
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return std::move(result_);
}

}  // namespace oases::train
