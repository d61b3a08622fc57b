// The element conversions of kernels.h (convert, encode_fp8, decode_fp8, reduce_into), apart
// from kernels.cc so that what needs only them (the activation store, and through it the fuzz
// targets' engine sources) links the conversions without every kernel of the engine.
#include "kernels/kernels.h"

#include "core/error.h"
#include "core/time_breakdown.h"
#include "kernels/argument_checks.h"
#include "kernels/cpu/convert.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

namespace oases::kernels {
namespace {

using detail::check_contiguous;

// Elements converted through f32 at a time by encode_fp8 and decode_fp8 (16 KiB of stack).
constexpr std::int64_t kFp8Piece = 4096;

bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }

void check_host(const char* what, const Tensor& a, const Tensor& b) {
  OASES_ASSERT(a.device().is_cpu() && b.device().is_cpu(), "{}: no kernel for {} -> {}", what,
               a.device().str(), b.device().str());
}

void check_fp8(const char* what, const Tensor& src, const Tensor& dst, const Tensor& codes,
               const Tensor& values) {
  check_contiguous(what, {&src, &dst});
  check_host(what, src, dst);
  OASES_ASSERT(codes.dtype() == DType::u8 && src.numel() == dst.numel(),
               "{}: {} {} elements into {} {}", what, src.numel(), dtype_name(src.dtype()),
               dst.numel(), dtype_name(dst.dtype()));
  OASES_ASSERT(values.dtype() == DType::f32 || values.dtype() == DType::f64 ||
                   is_16bit(values.dtype()),
               "{}: no kernel for {} tensors", what, dtype_name(values.dtype()));
}

}  // namespace

void convert(const Tensor& src, const Tensor& dst) {
  const TimedSection timed(TimeCategory::conversions);
  check_contiguous("convert", {&src, &dst});
  check_host("convert", src, dst);
  OASES_ASSERT(src.numel() == dst.numel(), "convert of {} elements into {}", src.numel(),
               dst.numel());
  cpu::convert_elements(src.raw(), src.dtype(), dst.raw(), dst.dtype(), src.numel());
}

void encode_fp8(const Tensor& src, const Tensor& dst, Fp8Format format) {
  const TimedSection timed(TimeCategory::conversions);
  check_fp8("encode_fp8", src, dst, dst, src);
  const std::int64_t n = src.numel();
  const auto encode = format == Fp8Format::e4m3 ? cpu::encode_e4m3 : cpu::encode_e5m2;
  auto* out = static_cast<std::uint8_t*>(dst.raw());
  if (src.dtype() == DType::f32) return encode(static_cast<const float*>(src.raw()), out, n);
  std::array<float, kFp8Piece> piece;
  const auto* in = static_cast<const std::byte*>(src.raw());
  const std::size_t element = src.element_size();
  for (std::int64_t begin = 0; begin < n; begin += kFp8Piece) {
    const std::int64_t count = std::min(n - begin, kFp8Piece);
    cpu::convert_elements(in + static_cast<std::size_t>(begin) * element, src.dtype(),
                          piece.data(), DType::f32, count);
    encode(piece.data(), out + begin, count);
  }
}

void decode_fp8(const Tensor& src, const Tensor& dst, Fp8Format format) {
  const TimedSection timed(TimeCategory::conversions);
  check_fp8("decode_fp8", src, dst, src, dst);
  const std::int64_t n = src.numel();
  const auto decode = format == Fp8Format::e4m3 ? cpu::decode_e4m3 : cpu::decode_e5m2;
  const auto* in = static_cast<const std::uint8_t*>(src.raw());
  if (dst.dtype() == DType::f32) return decode(in, static_cast<float*>(dst.raw()), n);
  std::array<float, kFp8Piece> piece;
  auto* out = static_cast<std::byte*>(dst.raw());
  const std::size_t element = dst.element_size();
  for (std::int64_t begin = 0; begin < n; begin += kFp8Piece) {
    const std::int64_t count = std::min(n - begin, kFp8Piece);
    decode(in + begin, piece.data(), count);
    cpu::convert_elements(piece.data(), DType::f32,
                          out + static_cast<std::size_t>(begin) * element, dst.dtype(), count);
  }
}

void reduce_into(const Tensor& in, const Tensor& inout, Reduction op) {
  const TimedSection timed(TimeCategory::elementwise);
  check_contiguous("reduce_into", {&in, &inout});
  check_host("reduce_into", in, inout);
  OASES_ASSERT(in.dtype() == inout.dtype() && is_16bit(in.dtype()) && in.numel() == inout.numel(),
               "reduce_into: {} {} elements into {} {}", in.numel(), dtype_name(in.dtype()),
               inout.numel(), dtype_name(inout.dtype()));
  if (in.dtype() == DType::bf16)
    cpu::reduce_into(static_cast<const BFloat16*>(in.raw()), static_cast<BFloat16*>(inout.raw()),
                     in.numel(), op);
  else
    cpu::reduce_into(static_cast<const Float16*>(in.raw()), static_cast<Float16*>(inout.raw()),
                     in.numel(), op);
}

}  // namespace oases::kernels
