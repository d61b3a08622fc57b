// How matrix products of 16-bit operands (bf16, f16) are computed: the path names, the
// per-format choice the kernels take as an argument, and the start-up measurement's report.
// The paths compute the same mathematics (f32 accumulation, one rounding of the result) but
// sum in different orders, so their last bits differ and one run keeps one path:
//  - convert_sgemm: widen both operands to f32 and multiply with the f32 product; every
//    device and format has it.
//  - onednn: oneDNN's matmul on the 16-bit operands, where oneDNN has a compiled kernel for the
//    format on this CPU (kernels/cpu/gemm16.h has the details).
// kernels.h's choose_gemm16_paths() measures both at start-up and explains its choice; the
// caller keeps the returned Gemm16Paths (nothing is stored globally) and passes it to every
// linear call. The value also carries the products' workspace (scratch memory and prepared
// oneDNN primitives reused from call to call), shared by its copies: the model that keeps the
// value creates and owns it.
#pragma once

#include "core/dtype.h"
#include "core/named_values.h"

#include <array>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace oases::kernels {

enum class Gemm16Path : std::uint8_t { convert_sgemm, onednn };

// train.gemm16_path's words: "convert+sgemm" and "oneDNN", and the aliases "convert_sgemm"
// and "onednn". A config pins a path because the two round differently in the last bits
// (summation order): a run that must repeat another bit for bit (a resumed run) uses the path
// that run used rather than measuring again.
inline constexpr std::array<NamedValue<Gemm16Path>, 4> kGemm16PathNames{
    {{Gemm16Path::convert_sgemm, "convert+sgemm"},
     {Gemm16Path::onednn, "oneDNN"},
     {Gemm16Path::convert_sgemm, "convert_sgemm"},
     {Gemm16Path::onednn, "onednn"}}};

// "convert+sgemm", "oneDNN".
inline std::string_view gemm16_path_name(Gemm16Path path) {
  return value_name<Gemm16Path>(kGemm16PathNames, path);
}

// The path a name of kGemm16PathNames gives; nullopt for any other string.
inline std::optional<Gemm16Path> gemm16_path_from_name(std::string_view name) {
  const Gemm16Path* path = find_named_value<Gemm16Path>(kGemm16PathNames, name);
  return path ? std::optional(*path) : std::nullopt;
}

// What the 16-bit products keep between calls (defined by the device's kernels,
// kernels/cpu/gemm16.cc): the oneDNN path's primitives for each product shape, built once
// (building them costs more than a small product), and the convert path's f32 scratch for each
// shape (fresh allocations of the widened operands page-fault on every call: 100 MB for a
// 50k-vocabulary head's weight). One entry per distinct shape, kept for the workspace's life,
// so its memory is bounded by the shapes a run multiplies (scratch that several threads use at
// once is duplicated, one copy per concurrent call). Thread-safe: kernels may be called from
// several threads with one workspace.
class Gemm16Workspace;

// A new, empty workspace.
std::shared_ptr<Gemm16Workspace> make_gemm16_workspace();

// The path each 16-bit format uses (the default, convert+sgemm, works everywhere) and the
// workspace the products reuse. Copies share one workspace. Null (the default, so that a value
// that only names paths owns nothing): every call allocates its scratch and builds its
// primitives afresh; the bits are the same either way. A model gives the value it keeps a
// workspace of its own.
struct Gemm16Paths {
  Gemm16Path bf16 = Gemm16Path::convert_sgemm;
  Gemm16Path f16 = Gemm16Path::convert_sgemm;
  std::shared_ptr<Gemm16Workspace> workspace;
  Gemm16Path for_dtype(DType operands) const { return operands == DType::f16 ? f16 : bf16; }
};

// Whether a path can multiply a format here; `detail` names the implementation (e.g. "oneDNN
// brg:avx512_core_bf16") or says why not (e.g. "oneDNN has only its reference f16 matmul on
// this CPU").
struct Gemm16Availability {
  bool available = false;
  std::string detail;
};

// The start-up choice for one format, with the measured times and a sentence for the log.
struct Gemm16Choice {
  DType operands = DType::bf16;
  Gemm16Path path = Gemm16Path::convert_sgemm;
  double convert_sgemm_seconds = 0;  // best of a few runs
  double onednn_seconds = 0;         // 0 when the path is unavailable
  std::string reason;
};

struct Gemm16PathsChoice {
  Gemm16Paths paths;
  Gemm16Choice bf16, f16;
};

}  // namespace oases::kernels
