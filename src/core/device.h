// Device, Stream and Event: where memory lives and in what order work on it runs.
//
// Code above core/ never assumes which device it runs on: it allocates through Buffer (which
// takes a Device), passes Tensors (which carry their Device), and orders work with Streams and
// Events, which mean what CUDA's streams and events mean:
//   - a Stream runs the work enqueued on it in enqueue order; work on different streams may
//     overlap unless Events order it;
//   - an Event marks a point in one stream's work: another stream waits for it (make_wait)
//     without blocking the host, or the host waits for it (synchronize); it carries the time
//     the stream reached it, so the duration of work on a stream is the time between two
//     events around it (elapsed_seconds), not host clocks around its enqueue.
//
// On the CPU a Stream runs in one of two modes, fixed when it is made (StreamMode):
//   immediate     enqueued work runs at once, inline on the calling thread (kernels
//                 parallelise internally), and an Event is reached when it is recorded:
//                 ordering costs nothing. The default, and how the CPU trains.
//   asynchronous  the stream owns a worker thread that runs its work in enqueue order while
//                 the caller goes on; make_wait blocks the waiting stream's worker, never the
//                 host. Programs run as on a GPU, with the host ahead of its streams, so a
//                 missing event shows up on the CPU as a wrong result or a data race
//                 (ThreadSanitizer) before any GPU exists. Work runs under the OpenMP thread
//                 limit its enqueuing thread had (omp_get_max_threads(), a per-thread setting
//                 that kernels parallelise within and some results depend on), as it would
//                 have run there.
//
// Errors. Work that throws on an immediate stream throws from enqueue(), to its caller. On an
// asynchronous stream the first exception is kept and rethrown on the host by the stream's
// next synchronize(). From the failure on, the stream skips its work (which would read what
// the failed work did not write) but still reaches its events, so that nothing waiting on them
// hangs; an event reached after a failure carries it, and a stream that waits on such an
// event fails with the same exception (an immediate one: make_wait throws it). synchronize()
// clears the failure once it has rethrown it, so work enqueued afterwards runs again.
// Event::synchronize() and query() report completion only, never a failure.
//
// Shutdown. The destructor of an asynchronous stream drains it: it returns once every
// enqueued piece of work has run (or been skipped) and the worker has stopped. A failure that
// no synchronize() has rethrown yet is written to the log, since a destructor cannot throw.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace oases {

enum class DeviceKind : std::uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;  // which device of its kind (0 for the CPU)

  static constexpr Device cpu() { return {}; }
  static constexpr Device cuda(int index) { return {DeviceKind::cuda, index}; }
  constexpr bool is_cpu() const { return kind == DeviceKind::cpu; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};

// Throws UserError when this build cannot run work on `device` (a CUDA device in a build
// without CUDA support, or an index out of range), naming what would be valid.
void check_device_available(Device device);

enum class StreamMode : std::uint8_t { immediate, asynchronous };
const char* stream_mode_name(StreamMode mode);  // "immediate", "asynchronous"
// The stream mode the environment asks for: asynchronous where OASES_ASYNC_CPU_STREAMS=1,
// immediate where it is unset, empty or 0; any other value is a UserError naming the variable
// and the valid values. Read at each call.
StreamMode stream_mode_from_environment();

namespace detail {
struct EventPoint;  // the point an Event marks in an asynchronous stream (device.cc)
}  // namespace detail

// An ordered queue of work on one device. enqueue() may be called from any thread (the work
// of one stream may enqueue onto another); synchronize() must not be called from the stream's
// own work.
class Stream {
 public:
  explicit Stream(Device device = Device::cpu(), StreamMode mode = StreamMode::immediate);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device device() const { return device_; }
  StreamMode mode() const { return worker_ ? StreamMode::asynchronous : StreamMode::immediate; }

  // Runs `work` (callable as work()) after everything enqueued before it: at once on an
  // immediate stream, later on the worker of an asynchronous one. Whatever `work` refers to
  // must stay valid until it has run (synchronize() or an event after it says when).
  template <class Work>
  void enqueue(Work&& work) {
    if (!worker_) {
      work();
      return;
    }
    enqueue_async(std::function<void()>(std::forward<Work>(work)));
  }
  // Blocks the host until every piece of work enqueued so far has run (immediate: returns at
  // once), then rethrows the stream's failure, if any (see the header comment).
  void synchronize();
  // Whether every piece of work enqueued so far has run.
  bool query() const;

 private:
  friend class Event;
  struct Worker;
  void enqueue_async(std::function<void()> work);

  Device device_;
  std::unique_ptr<Worker> worker_;  // null for an immediate stream
};

// A point in one stream's work. A handle: copies refer to the same recorded point, and
// recording again marks a new point (waits already made keep the old one).
//   record(s):         marks the work enqueued on s so far
//   make_wait(other):  work enqueued on `other` after this call runs only once the marked
//                      work has run (an asynchronous `other` waits on its worker; an immediate
//                      one, that is its caller, waits at once)
//   synchronize():     blocks the host until the marked work has run
//   query():           whether it has
//   time():            when the stream reached the point (the host's steady clock, read by the
//                      stream's worker, or at record() on an immediate stream)
// An Event never recorded counts as reached and has no time.
class Event {
 public:
  using Clock = std::chrono::steady_clock;

  Event() = default;
  void record(Stream& stream);
  void make_wait(Stream& other) const;
  void synchronize() const;
  bool query() const;
  bool recorded() const { return recorded_; }
  // Precondition: recorded() and query().
  Clock::time_point time() const;

 private:
  bool recorded_ = false;
  Device device_{};
  Clock::time_point time_{};                   // reached at record(): when
  std::shared_ptr<detail::EventPoint> point_;  // reached by a worker: null otherwise
};

// Seconds from `start` to `end` (both reached; negative when `end` was reached first).
double elapsed_seconds(const Event& start, const Event& end);

}  // namespace oases
