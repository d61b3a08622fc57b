#include "core/device.h"

#include "core/error.h"
#include "core/log.h"

#include <fmt/format.h>
#include <omp.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace oases {

std::string Device::str() const {
  return kind == DeviceKind::cpu ? std::string("cpu") : fmt::format("cuda:{}", index);
}

void check_device_available(Device device) {
  OASES_CHECK(device.is_cpu() && device.index == 0,
              "device {} is not available: this build runs on the CPU only; valid: cpu",
              device.str());
}

const char* stream_mode_name(StreamMode mode) {
  return mode == StreamMode::immediate ? "immediate" : "asynchronous";
}

StreamMode stream_mode_from_environment() {
  constexpr const char* kVariable = "OASES_ASYNC_CPU_STREAMS";
  const char* value = std::getenv(kVariable);
  if (value == nullptr || std::strcmp(value, "") == 0 || std::strcmp(value, "0") == 0)
    return StreamMode::immediate;
  OASES_CHECK(std::strcmp(value, "1") == 0,
              "{} = '{}' is not valid: valid values are 1 (asynchronous CPU streams) and 0 or "
              "unset (immediate)",
              kVariable, value);
  return StreamMode::asynchronous;
}

namespace detail {

// Reached once, by the worker of the stream it was recorded on; waited for by the host and by
// other streams' workers.
struct EventPoint {
  std::mutex mutex;
  std::condition_variable reached_cv;
  bool reached = false;
  Event::Clock::time_point time{};
  std::exception_ptr failure;  // the recording stream's, when it had failed before the point

  void reach(std::exception_ptr stream_failure) {
    {
      std::lock_guard lock(mutex);
      time = Event::Clock::now();
      failure = std::move(stream_failure);
      reached = true;
    }
    reached_cv.notify_all();
  }
  // Blocks until reached; the failure it carries, if any.
  std::exception_ptr wait() {
    std::unique_lock lock(mutex);
    reached_cv.wait(lock, [&] { return reached; });
    return failure;
  }
  bool is_reached() {
    std::lock_guard lock(mutex);
    return reached;
  }
};

}  // namespace detail

// The worker of an asynchronous stream: a queue of items run in order on its own thread.
struct Stream::Worker {
  struct Item {
    enum class Kind { work, reach, wait } kind = Kind::work;
    std::function<void()> work;                  // Kind::work
    std::shared_ptr<detail::EventPoint> point;  // Kind::reach, Kind::wait
    int threads = 1;  // Kind::work: the enqueuing thread's OpenMP limit (omp_get_max_threads)
  };

  std::mutex mutex;
  std::condition_variable wake;  // the worker: an item, or stopping
  std::condition_variable idle;  // synchronize(): an item has finished
  std::deque<Item> queue;
  std::uint64_t enqueued = 0, finished = 0;
  bool stopping = false;
  std::exception_ptr failure;  // the first one not yet rethrown by synchronize()
  std::thread thread;

  Worker() : thread([this] { loop(); }) {}

  ~Worker() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    wake.notify_one();
    thread.join();
    if (!failure) return;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      report_lost(e.what());
    } catch (...) {
      report_lost("an exception of unknown type");
    }
  }

  static void report_lost(const char* what) {
    try {
      log_error("a stream was destroyed with a failure no synchronize() reported: {}", what);
    } catch (...) {  // stderr is gone: nothing is left to tell
    }
  }

  void push(Item item) {
    {
      std::lock_guard lock(mutex);
      OASES_ASSERT(!stopping, "work enqueued on a stream being destroyed");
      queue.push_back(std::move(item));
      ++enqueued;
    }
    wake.notify_one();
  }

  void loop() {
    std::unique_lock lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return !queue.empty() || stopping; });
      if (queue.empty()) return;  // stopping, and drained
      Item item = std::move(queue.front());
      queue.pop_front();
      const std::exception_ptr failed = failure;
      lock.unlock();
      std::exception_ptr raised = run(item, failed);
      item = {};  // what the work captured goes before the lock is taken again
      lock.lock();
      if (raised && !failure) failure = std::move(raised);
      ++finished;
      idle.notify_all();
    }
  }

  // Runs one item on a stream that has failed with `failed` (or not); a new failure, if any.
  static std::exception_ptr run(Item& item, const std::exception_ptr& failed) {
    switch (item.kind) {
      case Item::Kind::work:
        if (failed) return nullptr;
        // The limit is a per-thread setting: without this the worker would run kernels on
        // the process's initial count, not the one the caller chose (train/threads.h).
        if (omp_get_max_threads() != item.threads) omp_set_num_threads(item.threads);
        try {
          item.work();
        } catch (...) {
          return std::current_exception();
        }
        return nullptr;
      case Item::Kind::reach: item.point->reach(failed); return nullptr;
      case Item::Kind::wait:
        // A failed stream runs nothing more that could need the point.
        return failed ? nullptr : item.point->wait();
    }
    return nullptr;
  }

  void synchronize() {
    std::unique_lock lock(mutex);
    const std::uint64_t target = enqueued;
    idle.wait(lock, [&] { return finished >= target; });
    if (failure) std::rethrow_exception(std::exchange(failure, nullptr));
  }

  bool query() {
    std::lock_guard lock(mutex);
    return finished == enqueued;
  }
};

Stream::Stream(Device device, StreamMode mode) : device_(device) {
  check_device_available(device);
  if (mode == StreamMode::asynchronous) worker_ = std::make_unique<Worker>();
}

Stream::~Stream() = default;

void Stream::enqueue_async(std::function<void()> work) {
  worker_->push({Worker::Item::Kind::work, std::move(work), nullptr, omp_get_max_threads()});
}

void Stream::synchronize() {
  if (worker_) worker_->synchronize();
}

bool Stream::query() const { return !worker_ || worker_->query(); }

void Event::record(Stream& stream) {
  recorded_ = true;
  device_ = stream.device();
  if (!stream.worker_) {
    point_.reset();
    time_ = Clock::now();
    return;
  }
  point_ = std::make_shared<detail::EventPoint>();
  stream.worker_->push({Stream::Worker::Item::Kind::reach, nullptr, point_, 1});
}

void Event::make_wait(Stream& other) const {
  OASES_ASSERT(!recorded_ || other.device() == device_,
               "an event recorded on {} cannot order work on {}", device_.str(),
               other.device().str());
  if (!point_) return;
  if (other.worker_) {
    other.worker_->push({Stream::Worker::Item::Kind::wait, nullptr, point_, 1});
    return;
  }
  if (std::exception_ptr failure = point_->wait()) std::rethrow_exception(failure);
}

void Event::synchronize() const {
  if (point_) point_->wait();
}

bool Event::query() const { return !point_ || point_->is_reached(); }

Event::Clock::time_point Event::time() const {
  OASES_ASSERT(recorded_, "the time of an event never recorded");
  if (!point_) return time_;
  std::lock_guard lock(point_->mutex);
  OASES_ASSERT(point_->reached, "the time of an event its stream has not reached yet");
  return point_->time;
}

double elapsed_seconds(const Event& start, const Event& end) {
  return std::chrono::duration<double>(end.time() - start.time()).count();
}

}  // namespace oases
