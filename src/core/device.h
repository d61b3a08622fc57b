// Device, Stream and Event: where memory lives and in what order work on it runs.
//
// Code above core/ never assumes which device it runs on: it allocates through Buffer (which
// takes a Device), passes Tensors (which carry their Device), and orders work with Streams and
// Events. On the CPU device compute runs inline on the calling thread (kernels parallelise
// internally), so a Stream is idle whenever control returns to its caller and an Event is
// complete as soon as it is recorded; each communicator keeps its own progress thread
// (comm/). A CUDA backend gives the same three types real streams and events: a Wait on a
// collective then becomes "the compute stream waits on the communication stream's event",
// never a host synchronisation.
#pragma once

#include <cstdint>
#include <string>

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

// An ordered queue of work on one device. Work enqueued on one stream runs in enqueue order;
// work on different streams may overlap unless ordered by Events.
class Stream {
 public:
  explicit Stream(Device device = Device::cpu());
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device device() const { return device_; }
  // Returns once every piece of work enqueued so far has finished (CPU: immediately).
  void synchronize();

 private:
  Device device_;
};

// A point in one stream's work.
//   record(s):         marks the work enqueued on s so far
//   make_wait(other):  work enqueued on `other` after this call starts only once the recorded
//                      work has finished (without blocking the host)
//   synchronize():     blocks the host until the recorded work has finished
//   query():           whether it has finished
// An Event never recorded counts as finished.
class Event {
 public:
  Event() = default;
  void record(Stream& stream);
  void make_wait(Stream& other) const;
  void synchronize() const;
  bool query() const;
  bool recorded() const { return recorded_; }

 private:
  bool recorded_ = false;
  Device device_{};
};

}  // namespace oases
