// The physical memory of this host, against which a run's needs are checked before it
// allocates (a run that cannot fit would otherwise grow until the kernel kills it, silently).
#pragma once

#include <cstdint>

namespace oases {

// Bytes of physical memory (sysconf: pages x page size); 0 when the system does not say.
std::uint64_t physical_memory_bytes();

}  // namespace oases
