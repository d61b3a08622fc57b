// Counter-based random numbers: Philox 4x32 with 10 rounds (Salmon et al., SC'11).
// A draw is a pure function of (key, counter): no state, no order dependence. The engine keys
// every random number by global indices (parameter name + element index for initialisation;
// step, layer, site, sample, position, feature for dropout), so results do not depend on how
// the work is split across ranks or threads.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace oases {

using PhiloxCounter = std::array<std::uint32_t, 4>;
using PhiloxKey = std::array<std::uint32_t, 2>;

constexpr PhiloxCounter philox4x32(PhiloxCounter c, PhiloxKey k) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{kMul0} * c[0];
    const std::uint64_t p1 = std::uint64_t{kMul1} * c[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

// Uniform in (0, 1]: 24 random bits, never exactly 0 (safe for log).
constexpr float uniform_open0(std::uint32_t bits) {
  return (static_cast<float>(bits >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

// Uniform in (0, 1] with 53-bit resolution from two words.
inline double uniform_open0_f64(std::uint32_t hi, std::uint32_t lo) {
  const std::uint64_t bits = (std::uint64_t{hi} << 21) ^ (lo >> 11);  // 53 bits
  return (static_cast<double>(bits & ((std::uint64_t{1} << 53) - 1)) + 1.0) * 0x1.0p-53;
}

// Standard normal from one Philox block (Box-Muller on the first two 53-bit uniforms).
inline double normal_from_block(const PhiloxCounter& r) {
  const double u1 = uniform_open0_f64(r[0], r[1]);
  const double u2 = uniform_open0_f64(r[2], r[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// 64-bit FNV-1a: a stable hash of a name, used to give each parameter its own key.
constexpr std::uint64_t fnv1a64(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char ch : text) {
    h ^= static_cast<unsigned char>(ch);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Key for a named stream under a seed.
constexpr PhiloxKey philox_key(std::uint64_t seed, std::uint64_t stream) {
  const std::uint64_t mixed = seed ^ (stream * 0x9E3779B97F4A7C15ull);
  return {static_cast<std::uint32_t>(mixed), static_cast<std::uint32_t>(mixed >> 32)};
}

}  // namespace oases
