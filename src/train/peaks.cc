#include "train/peaks.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/kernels.h"
#include "plan/settings.h"
#include "sim/cluster.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>

namespace oases::train {
namespace {

using nlohmann::json;

// Raised when what a measurement means changes (its shapes): records of another format are
// measured again.
constexpr int kPeakFileFormat = 2;

// The /proc/cpuinfo line starting with `field` of the first processor ("" when absent).
std::string cpuinfo_field(const std::string& field) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind(field, 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : line.substr(start);
  }
  return {};
}

// The flags that decide how fast products run: the vector extensions and the matrix units.
std::string vector_isa_flags() {
  std::istringstream flags(cpuinfo_field("flags"));
  std::vector<std::string> kept;
  for (std::string flag; flags >> flag;)
    if (flag.rfind("avx", 0) == 0 || flag.rfind("amx", 0) == 0 || flag == "fma" ||
        flag == "f16c" || flag.rfind("sse4", 0) == 0)
      kept.push_back(flag);
  std::sort(kept.begin(), kept.end());
  return fmt::format("{}", fmt::join(kept, " "));
}

json key_json(const PeakKey& k) {
  return {{"cpu", k.cpu},       {"isa", k.isa},       {"threads", k.threads},
          {"blas", k.blas},     {"onednn", k.onednn}, {"precision", k.precision},
          {"path", k.path}};
}

json record_json(const PeakRecord& r) {
  return {{"key", key_json(r.key)},
          {"flops_per_s", r.peak.flops_per_s},
          {"measured_at", r.measured_at},
          {"seconds", r.peak.seconds},
          {"cpu_share", r.peak.cpu_share},
          {"loaded", r.peak.loaded},
          {"runs", r.peak.runs},
          {"shape", r.peak.shape}};
}

PeakRecord record_of(const json& j) {
  PeakRecord r;
  const json& k = j.at("key");
  r.key = PeakKey{k.at("cpu").get<std::string>(),    k.at("isa").get<std::string>(),
                  k.at("threads").get<int>(),        k.at("blas").get<std::string>(),
                  k.at("onednn").get<std::string>(), k.at("precision").get<std::string>(),
                  k.at("path").get<std::string>()};
  r.peak.flops_per_s = j.at("flops_per_s").get<double>();
  r.measured_at = j.at("measured_at").get<std::string>();
  r.peak.seconds = j.value("seconds", 0.0);
  r.peak.cpu_share = j.value("cpu_share", 1.0);
  r.peak.loaded = j.value("loaded", false);
  r.peak.runs = j.value("runs", 0);
  r.peak.shape = j.value("shape", std::string());
  return r;
}

// An flock on FILE.lock, held while the object lives (shared for reads, exclusive for writes).
class PeakFileLock {
 public:
  PeakFileLock(const std::filesystem::path& file, bool exclusive) {
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
    const std::string lock = file.string() + ".lock";
    fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ >= 0) ::flock(fd_, exclusive ? LOCK_EX : LOCK_SH);
  }
  ~PeakFileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  PeakFileLock(const PeakFileLock&) = delete;
  PeakFileLock& operator=(const PeakFileLock&) = delete;

 private:
  int fd_ = -1;
};

// The records of `file`; nullopt (with the reason in `problem`) when it exists but cannot be
// read as a peak file. A missing file has no records.
std::optional<std::vector<PeakRecord>> read_records(const std::filesystem::path& file,
                                                    std::string* problem) {
  std::ifstream in(file);
  if (!in) return std::vector<PeakRecord>{};
  try {
    const json j = json::parse(in);
    std::vector<PeakRecord> out;
    if (j.value("format", 0) != kPeakFileFormat) return out;
    for (const json& r : j.at("peaks")) out.push_back(record_of(r));
    return out;
  } catch (const std::exception& e) {
    if (problem) *problem = e.what();
    return std::nullopt;
  }
}

// "fp32=2e11,bf16=4e11": the test seam's peaks by precision word.
std::map<std::string, double> parse_test_peaks(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    const auto eq = item.find('=');
    const std::string word = item.substr(0, eq);
    const bool known = word == "fp32" || word == "fp64" || word == "bf16" || word == "fp16";
    char* end = nullptr;
    const double value = eq == std::string::npos ? 0 : std::strtod(item.c_str() + eq + 1, &end);
    OASES_CHECK(known && eq != std::string::npos && end != nullptr && *end == '\0' && value > 0,
                "OASES_TEST_PEAKS = \"{}\": \"{}\" is not PRECISION=FLOPS with PRECISION one of "
                "fp32, fp64, bf16, fp16 and FLOPS a positive number",
                text, item);
    out[word] = value;
  }
  return out;
}

}  // namespace

std::string cpu_model_name() {
  const std::string name = cpuinfo_field("model name");
  return name.empty() ? "unknown" : name;
}

std::string iso8601_utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string precision_word(DType operands) {
  OASES_ASSERT(operands == DType::f32 || operands == DType::f64 || operands == DType::bf16 ||
                   operands == DType::f16,
               "precision_word: no products of {}", dtype_name(operands));
  return std::string(sim::precision_key(operands));
}

std::string product_path_word(DType operands, kernels::Gemm16Path path) {
  if (operands == DType::f32) return "sgemm";
  if (operands == DType::f64) return "dgemm";
  return std::string(kernels::gemm16_path_name(path));
}

PeakKey this_host_peak_key(DType operands, kernels::Gemm16Path path, int threads) {
  return PeakKey{cpu_model_name(),             vector_isa_flags(),      threads,
                 kernels::blas_description(),   kernels::onednn_version(),
                 precision_word(operands),      product_path_word(operands, path)};
}

std::filesystem::path default_peak_file() {
  if (const char* cache = std::getenv("OASES_CACHE"); cache != nullptr && *cache != '\0')
    return std::filesystem::path(cache) / "peaks.json";
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home != nullptr && *home != '\0' ? home : ".") / ".cache" /
         "oases" / "peaks.json";
}

std::optional<PeakRecord> PeakFile::find(const PeakKey& key) const {
  for (PeakRecord& r : all())
    if (r.key == key) return std::move(r);
  return std::nullopt;
}

std::vector<PeakRecord> PeakFile::all() const {
  const PeakFileLock lock(file_, false);
  return read_records(file_, nullptr).value_or(std::vector<PeakRecord>{});
}

void PeakFile::store(const PeakRecord& record,
                     const std::function<void(const std::string&)>& warn) const {
  const PeakFileLock lock(file_, true);
  std::string problem;
  std::vector<PeakRecord> records = read_records(file_, &problem).value_or(std::vector<PeakRecord>{});
  if (!problem.empty() && warn)
    warn(fmt::format("the peak file {} could not be read ({}); writing it anew", file_.string(),
                     problem));
  std::erase_if(records, [&](const PeakRecord& r) { return r.key == record.key; });
  records.push_back(record);
  json out = {{"format", kPeakFileFormat}, {"peaks", json::array()}};
  for (const PeakRecord& r : records) out["peaks"].push_back(record_json(r));
  try {
    write_file_atomically(file_.string(), out.dump(2) + "\n");
  } catch (const std::exception& e) {
    // A read-only home folder costs a measurement per run, nothing more.
    if (warn) warn(fmt::format("the peak could not be kept in {}: {}", file_.string(), e.what()));
  }
}

MeasurePeak peak_measurement_from_environment() {
  const char* seam = std::getenv("OASES_TEST_PEAKS");
  if (seam == nullptr || *seam == '\0')
    return [](DType operands, kernels::Gemm16Path path, double seconds) {
      return kernels::measure_product_peak(operands, path, seconds);
    };
  const std::map<std::string, double> given = parse_test_peaks(seam);
  return [given](DType operands, kernels::Gemm16Path path, double seconds) {
    const auto it = given.find(precision_word(operands));
    if (it == given.end()) return kernels::measure_product_peak(operands, path, seconds);
    return kernels::ProductPeak{it->second, 0.0, 1.0, false, 1, "OASES_TEST_PEAKS"};
  };
}

double peak_seconds_from_environment() {
  const char* text = std::getenv("OASES_PEAK_SECONDS");
  if (text == nullptr || *text == '\0') return kDefaultPeakSeconds;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  OASES_CHECK(end != text && *end == '\0' && seconds > 0 && seconds <= 600,
              "OASES_PEAK_SECONDS = \"{}\": the seconds a peak measurement lasts must be a "
              "number in (0, 600]",
              text);
  return seconds;
}

HostPeaks::HostPeaks(PeakFile file, int threads, double seconds, MeasurePeak measure,
                     std::function<void(const std::string&)> warn)
    : file_(std::move(file)),
      threads_(threads),
      seconds_(seconds),
      measure_(std::move(measure)),
      warn_(std::move(warn)) {}

HostPeak HostPeaks::get(DType operands, kernels::Gemm16Path path, bool remeasure) {
  const PeakKey key = this_host_peak_key(operands, path, threads_);
  if (!remeasure)
    if (std::optional<PeakRecord> kept = file_.find(key)) return HostPeak{std::move(*kept), false};
  PeakRecord record{key, measure_(operands, path, seconds_), iso8601_utc_now()};
  file_.store(record, warn_);
  return HostPeak{std::move(record), true};
}

HostPeaks host_peaks_from_environment() {
  return HostPeaks(PeakFile(default_peak_file()), omp_get_max_threads(),
                   peak_seconds_from_environment(), peak_measurement_from_environment(),
                   [](const std::string& warning) { log_warning("{}", warning); });
}

std::string describe_peak(const HostPeak& peak, const std::filesystem::path& file) {
  const PeakRecord& r = peak.record;
  std::string when = r.measured_at;
  if (when.size() == 20 && when[10] == 'T') when = when.substr(0, 10) + " " + when.substr(11, 5) + " UTC";
  return fmt::format("{:.1f} GFLOP/s of {} products ({}, {} thread{}; {} {}{}, {} {})",
                     r.peak.flops_per_s / 1e9, r.key.precision, r.key.path, r.key.threads,
                     r.key.threads == 1 ? "" : "s", peak.measured_now ? "measured now," : "measured",
                     when,
                     r.peak.loaded ? fmt::format(" on a busy machine ({:.0f}% of the cores, rate "
                                                 "scaled up accordingly)",
                                                 100 * r.peak.cpu_share)
                                   : std::string(),
                     peak.measured_now ? "kept in" : "read from", file.string());
}

Bf16Comparison compare_bf16_with_fp32(HostPeaks& peaks,
                                      std::optional<kernels::Gemm16Path> bf16_path) {
  Bf16Comparison c;
  if (bf16_path) {
    c.bf16_available = kernels::gemm16_available(*bf16_path, DType::bf16).available;
    c.bf16_path = *bf16_path;
  } else {
    c.bf16_available = true;  // convert+sgemm works everywhere
    // The faster path this host has kept a peak for; else the start-up choice, measured.
    std::optional<PeakRecord> kept;
    for (kernels::Gemm16Path path : {kernels::Gemm16Path::convert_sgemm, kernels::Gemm16Path::onednn})
      if (auto r = peaks.file().find(this_host_peak_key(DType::bf16, path, peaks.threads())))
        if (!kept || r->peak.flops_per_s > kept->peak.flops_per_s) kept = std::move(r);
    c.bf16_path = kept ? *kernels::gemm16_path_from_name(kept->key.path)
                       : kernels::choose_gemm16_path(DType::bf16).path;
  }
  c.fp32 = peaks.get(DType::f32, kernels::Gemm16Path::convert_sgemm);
  if (!c.bf16_available) return c;
  c.bf16 = peaks.get(DType::bf16, c.bf16_path);
  c.speedup = c.bf16->record.peak.flops_per_s / c.fp32->record.peak.flops_per_s;
  return c;
}

std::string describe_auto_choice(const Bf16Comparison& c) {
  if (!c.bf16_available || !c.bf16)
    return "train.precision = \"auto\": fp32 (no bf16 product path on this CPU)";
  return fmt::format(
      "train.precision = \"auto\": {} (bf16 products {:.2f}x as fast as fp32's here: {:.1f} "
      "against {:.1f} GFLOP/s, bf16 by {}; bf16 is chosen from {:.2f}x)",
      c.bf16_pays() ? "bf16 mixed precision" : "fp32", c.speedup,
      c.bf16->record.peak.flops_per_s / 1e9, c.fp32->record.peak.flops_per_s / 1e9,
      c.bf16->record.key.path, kAutoBf16Speedup);
}

plan::RunConfig resolve_auto_precision(const plan::RunConfig& config, HostPeaks* peaks,
                                       comm::Communicator& world, std::string* choice) {
  const plan::Settings settings = plan::parse_settings(config);
  if (settings.precision != plan::Precision::automatic) return config;
  std::int32_t chosen[2] = {0, 0};  // bf16 or not; the bf16 path
  if (world.rank() == 0) {
    OASES_ASSERT(peaks != nullptr, "resolve_auto_precision: rank 0 has no peaks");
    const Bf16Comparison c = compare_bf16_with_fp32(*peaks, settings.gemm16_path);
    chosen[0] = c.bf16_pays() ? 1 : 0;
    chosen[1] = static_cast<std::int32_t>(c.bf16_path);
    if (choice != nullptr) *choice = describe_auto_choice(c);
  }
  world.broadcast(Tensor::of(chosen, {2}), 0);
  plan::RunConfig resolved = config;
  resolved.train.precision = chosen[0] == 1 ? "bf16" : "fp32";
  if (chosen[0] == 1 && !settings.gemm16_path)
    resolved.train.gemm16_path =
        std::string(kernels::gemm16_path_name(static_cast<kernels::Gemm16Path>(chosen[1])));
  return resolved;
}

namespace {

DType operands_of_word(const std::string& word) {
  if (word == "fp32") return DType::f32;
  if (word == "fp64") return DType::f64;
  if (word == "bf16") return DType::bf16;
  OASES_CHECK(word == "fp16", "--precision {}: valid: fp32, fp64, bf16, fp16 (or all)", word);
  return DType::f16;
}

std::string readable_time(const std::string& iso) {
  if (iso.size() == 20 && iso[10] == 'T') return iso.substr(0, 10) + " " + iso.substr(11, 5) + " UTC";
  return iso;
}

}  // namespace

PeakTable host_peak_table(HostPeaks& peaks, const std::vector<std::string>& precisions,
                          bool measure, std::optional<kernels::Gemm16Path> gemm16_path) {
  PeakTable table;
  table.host = this_host_peak_key(DType::f32, kernels::Gemm16Path::convert_sgemm, peaks.threads());
  table.host.precision.clear();
  table.host.path.clear();
  table.file = peaks.file().path();
  std::vector<std::string> words;
  for (const std::string& word : precisions) {
    if (word == "all") {
      for (const char* w : {"fp32", "fp64", "bf16", "fp16"}) words.emplace_back(w);
    } else {
      operands_of_word(word);  // named in the error when unknown
      words.push_back(word);
    }
  }
  for (const std::string& word : words) {
    const DType operands = operands_of_word(word);
    kernels::Gemm16Path path = kernels::Gemm16Path::convert_sgemm;
    if (operands == DType::bf16 || operands == DType::f16) {
      if (gemm16_path) {
        if (!kernels::gemm16_available(*gemm16_path, operands).available) {
          table.missing.push_back(fmt::format("{} by {} (not available on this CPU)", word,
                                              kernels::gemm16_path_name(*gemm16_path)));
          continue;
        }
        path = *gemm16_path;
      } else if (measure) {
        path = kernels::choose_gemm16_path(operands).path;
      } else {
        // As kept: the faster of the paths the file has.
        std::optional<PeakRecord> best;
        for (kernels::Gemm16Path p : {kernels::Gemm16Path::convert_sgemm, kernels::Gemm16Path::onednn})
          if (auto kept = peaks.file().find(this_host_peak_key(operands, p, peaks.threads())))
            if (!best || kept->peak.flops_per_s > best->peak.flops_per_s) best = std::move(kept);
        if (best) {
          table.peaks.push_back(HostPeak{std::move(*best), false});
        } else {
          table.missing.push_back(word + " (not measured yet)");
        }
        continue;
      }
    }
    if (!measure) {
      if (auto kept = peaks.file().find(this_host_peak_key(operands, path, peaks.threads())))
        table.peaks.push_back(HostPeak{std::move(*kept), false});
      else
        table.missing.push_back(word + " (not measured yet)");
      continue;
    }
    table.peaks.push_back(peaks.get(operands, path, true));
  }
  return table;
}

std::string format_peak_table(const PeakTable& t) {
  std::string out = fmt::format("peaks of this host: {} ({}), {} thread{}, {}, {}\n", t.host.cpu,
                                t.host.isa.empty() ? "no vector extensions" : t.host.isa,
                                t.host.threads, t.host.threads == 1 ? "" : "s", t.host.blas,
                                t.host.onednn);
  out += fmt::format("{:<10} {:<14} {:>10} {:>16} {:<22} {}\n", "precision", "path", "GFLOP/s",
                     "best shape", "measured", "note");
  for (const HostPeak& p : t.peaks) {
    const PeakRecord& r = p.record;
    out += fmt::format("{:<10} {:<14} {:>10.1f} {:>16} {:<22} {}\n", r.key.precision, r.key.path,
                       r.peak.flops_per_s / 1e9, r.peak.shape, readable_time(r.measured_at),
                       r.peak.loaded ? fmt::format("busy machine: {:.0f}% of the cores, scaled",
                                                   100 * r.peak.cpu_share)
                                     : std::string(p.measured_now ? "measured now" : "kept"));
  }
  for (const std::string& m : t.missing) out += fmt::format("not shown: {}\n", m);
  out += fmt::format("kept in {}\n", t.file.string());
  return out;
}

std::string peak_table_json(const PeakTable& t) {
  json peaks = json::object();
  for (const HostPeak& p : t.peaks) {
    const PeakRecord& r = p.record;
    peaks[r.key.precision] = {{"flops_per_s", r.peak.flops_per_s}, {"path", r.key.path},
                              {"measured", r.measured_at},         {"seconds", r.peak.seconds},
                              {"cpu_share", r.peak.cpu_share},     {"loaded", r.peak.loaded},
                              {"shape", r.peak.shape},             {"measured_now", p.measured_now}};
  }
  const json out = {{"host",
                     {{"cpu", t.host.cpu},
                      {"flags", t.host.isa},
                      {"threads", t.host.threads},
                      {"blas", t.host.blas},
                      {"onednn", t.host.onednn}}},
                    {"cache", t.file.string()},
                    {"peaks", peaks},
                    {"missing", t.missing}};
  return out.dump(2) + "\n";
}

}  // namespace oases::train
