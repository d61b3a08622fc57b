#include "core/device.h"

#include "core/error.h"

#include <fmt/format.h>

namespace oases {

std::string Device::str() const {
  return kind == DeviceKind::cpu ? std::string("cpu") : fmt::format("cuda:{}", index);
}

void check_device_available(Device device) {
  OASES_CHECK(device.is_cpu() && device.index == 0,
              "device {} is not available: this build runs on the CPU only; valid: cpu",
              device.str());
}

Stream::Stream(Device device) : device_(device) { check_device_available(device); }

void Stream::synchronize() {}

void Event::record(Stream& stream) {
  recorded_ = true;
  device_ = stream.device();
}

void Event::make_wait(Stream& other) const {
  OASES_ASSERT(!recorded_ || other.device() == device_,
               "an event recorded on {} cannot order work on {}", device_.str(),
               other.device().str());
}

void Event::synchronize() const {}

bool Event::query() const { return true; }

}  // namespace oases
