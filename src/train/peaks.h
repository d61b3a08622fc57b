// The peak FLOP/s of this host's matrix products, per precision and product path: measured
// once (kernels::measure_product_peak) and kept in a small JSON file, so that MFU divides by
// the peak of the precision the products run in, measured when the machine was free rather
// than at every start-up under whatever else it was doing.
//
// The file, ${OASES_CACHE:-~/.cache/oases}/peaks.json, holds one record per key: a record is
// reused only while the CPU (model name and vector-instruction flags), the thread count, the
// BLAS and oneDNN builds, the precision and the product path all stay the same; anything else
// measures again. `oases peak` re-measures on request, and a run whose MFU comes out above 1
// (a peak measured while the machine was busy) re-measures once and replaces the record.
//
// Also here: train.precision = "auto", which picks bf16 mixed precision where this host's bf16
// products are at least kAutoBf16Speedup times as fast as its fp32 ones.
#pragma once

#include "comm/communicator.h"
#include "core/dtype.h"
#include "kernels/gemm16_paths.h"
#include "kernels/types.h"
#include "plan/run_config.h"

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace oases::train {

// /proc/cpuinfo's "model name" ("unknown" where there is none).
std::string cpu_model_name();
// Now in UTC, "2026-12-06T14:30:00Z".
std::string iso8601_utc_now();

// What a measured peak depends on; records are reused only under an equal key.
struct PeakKey {
  std::string cpu;        // /proc/cpuinfo's model name
  std::string isa;        // the vector-instruction flags of the CPU (avx2, fma, avx512*, amx*)
  int threads = 1;        // OpenMP threads of the products
  std::string blas;       // kernels::blas_description()
  std::string onednn;     // kernels::onednn_version()
  std::string precision;  // "fp32", "fp64", "bf16", "fp16"
  std::string path;       // "sgemm", "dgemm", or the 16-bit path's name ("oneDNN", "convert+sgemm")
  bool operator==(const PeakKey&) const = default;
};

struct PeakRecord {
  PeakKey key;
  kernels::ProductPeak peak;
  std::string measured_at;  // ISO 8601 UTC, "2026-12-06T14:30:00Z"
};

// "fp32", "fp64", "bf16", "fp16" for the products' operand types f32, f64, bf16, f16.
std::string precision_word(DType operands);
// The path word of the key: "sgemm" (f32), "dgemm" (f64), else gemm16_path_name(path).
std::string product_path_word(DType operands, kernels::Gemm16Path path);

// This host's key for products in `operands` by `path` on `threads` threads.
PeakKey this_host_peak_key(DType operands, kernels::Gemm16Path path, int threads);

// ${OASES_CACHE}/peaks.json when OASES_CACHE is set, else $HOME/.cache/oases/peaks.json.
std::filesystem::path default_peak_file();

// The records file. Reads take a shared lock and writes an exclusive one (on peaks.json.lock
// beside it), so that ranks and runs sharing a home folder never see half a file; a write
// replaces the file atomically. An unreadable file is reported by `store` (a warning through
// `warn`) and rewritten with the new record.
class PeakFile {
 public:
  explicit PeakFile(std::filesystem::path file) : file_(std::move(file)) {}
  std::optional<PeakRecord> find(const PeakKey& key) const;
  std::vector<PeakRecord> all() const;
  // Adds `record`, replacing the one of the same key.
  void store(const PeakRecord& record, const std::function<void(const std::string&)>& warn) const;
  const std::filesystem::path& path() const { return file_; }

 private:
  std::filesystem::path file_;
};

// How a peak is measured: kernels::measure_product_peak, or a test's stand-in.
using MeasurePeak = std::function<kernels::ProductPeak(DType, kernels::Gemm16Path, double seconds)>;

// The measurement every caller uses: the kernels', or, when the environment sets
// OASES_TEST_PEAKS="fp32=2e11,bf16=4e11,..." (a test seam), those FLOP/s for the precisions
// it names (instantly; the kernels' measurement for the others). UserError naming the variable
// when it is malformed.
MeasurePeak peak_measurement_from_environment();

// Seconds a measurement lasts: OASES_PEAK_SECONDS when set (a positive number; UserError
// naming the variable otherwise), else kDefaultPeakSeconds.
inline constexpr double kDefaultPeakSeconds = 1.5;
double peak_seconds_from_environment();

// A peak as a run uses it, and where it came from.
struct HostPeak {
  PeakRecord record;
  bool measured_now = false;  // false: read from the file
};

// This host's peaks at one thread count: from the file when its key is there, else measured
// and stored.
class HostPeaks {
 public:
  HostPeaks(PeakFile file, int threads, double seconds, MeasurePeak measure,
            std::function<void(const std::string&)> warn);
  // The peak of `operands` by `path` (ignored for f32 and f64); `remeasure`: measure even
  // when the file has it. For 16-bit operands REQUIRES gemm16_available(path, operands).
  HostPeak get(DType operands, kernels::Gemm16Path path, bool remeasure = false);
  const PeakFile& file() const { return file_; }
  int threads() const { return threads_; }

 private:
  PeakFile file_;
  int threads_;
  double seconds_;
  MeasurePeak measure_;
  std::function<void(const std::string&)> warn_;
};

// The environment's HostPeaks at the current OpenMP thread count, warnings to the log.
HostPeaks host_peaks_from_environment();

// "224.1 GFLOP/s of fp32 products (sgemm, 2 threads; measured 2026-12-06 14:30 UTC, kept in
// /root/.cache/oases/peaks.json)", with the share of the cores when measured on a busy machine.
std::string describe_peak(const HostPeak& peak, const std::filesystem::path& file);

// train.precision = "auto" chooses bf16 mixed precision where bf16 products run at least this
// many times as fast as fp32 ones, fp32 elsewhere.
inline constexpr double kAutoBf16Speedup = 1.3;

// The comparison behind "auto" and behind the fp32 start-up hint.
struct Bf16Comparison {
  bool bf16_available = false;    // some 16-bit path multiplies bf16 here
  kernels::Gemm16Path bf16_path = kernels::Gemm16Path::convert_sgemm;
  std::optional<HostPeak> fp32, bf16;
  double speedup = 0;             // bf16 peak / fp32 peak; 0 when bf16 is unavailable
  bool bf16_pays() const { return speedup >= kAutoBf16Speedup; }
};

// Measures (or reads) the fp32 peak and the bf16 peak by `bf16_path` (nullopt: the faster of
// the paths the file keeps a bf16 peak for, else kernels::choose_gemm16_path's) and compares
// them.
Bf16Comparison compare_bf16_with_fp32(HostPeaks& peaks, std::optional<kernels::Gemm16Path> bf16_path);

// The sentence a run logs for its "auto" choice, e.g. "train.precision = "auto": bf16 mixed
// precision (bf16 products 1.84x as fast as fp32's here: 412.0 against 224.1 GFLOP/s; bf16 is
// chosen from 1.30x)".
std::string describe_auto_choice(const Bf16Comparison& comparison);

// `config` with train.precision = "auto" resolved (unchanged otherwise): rank 0 of `world`
// compares its host's bf16 and fp32 peaks (compare_bf16_with_fp32 by train.gemm16_path when
// it pins one; `peaks` must be non-null there) and tells the other ranks, so every rank runs
// the same precision; a bf16 choice pins train.gemm16_path to the path it measured, so the
// run multiplies by it. Rank 0's `choice` receives describe_auto_choice's sentence.
// Collective over `world`.
plan::RunConfig resolve_auto_precision(const plan::RunConfig& config, HostPeaks* peaks,
                                       comm::Communicator& world, std::string* choice);

// `oases peak`: the peaks of the given precisions (words of precision_word), each measured
// now (or, with `measure` false, as the file keeps them: those it lacks are left out), and
// the table or JSON document that shows them.
struct PeakTable {
  PeakKey host;                      // the key's host part (precision and path empty)
  std::filesystem::path file;
  std::vector<HostPeak> peaks;
  std::vector<std::string> missing;  // asked for but not kept (measure false), or not available
};
// 16-bit precisions use `gemm16_path` when given, else the faster path
// (kernels::choose_gemm16_path). UserError naming --precision for an unknown word.
PeakTable host_peak_table(HostPeaks& peaks, const std::vector<std::string>& precisions,
                          bool measure, std::optional<kernels::Gemm16Path> gemm16_path);
std::string format_peak_table(const PeakTable& table);
// {"host": {"cpu", "flags", "threads", "blas", "onednn"}, "cache": FILE, "peaks": {"fp32":
// {"flops_per_s", "path", "measured", "seconds", "cpu_share", "loaded", "shape"}, ...}}
std::string peak_table_json(const PeakTable& table);

}  // namespace oases::train
