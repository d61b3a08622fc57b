// Reading and exporting a Hugging Face model folder of a 1B-parameter model (Llama 3.2 1B's
// shapes: 1.24e9 parameters, bf16, sharded), against the disk's own sequential read and write
// speed measured in the same run on a file of the same size.
//
// Every timed read starts cold: the files' pages are dropped from the page cache first
// (posix_fadvise DONTNEED after fsync), so both sides read from the device. Writes end with
// fsync (the export's files are written atomically, which fsyncs each).
//   read    SafetensorsSet::open and every tensor read as float32 (what `--init-from DIR`
//           does for a one-process fp32 run), vs reading the reference file sequentially;
//   export  `oases export` of the folder (bf16 kept: the stored bytes copied), vs reading
//           the reference file and writing a copy of it.
// Prints one JSON object per round and the best (smallest) time of each side.
//
//   model_folder --dir /tmp/model_folder_bench [--rounds 2] [--shard-size 1GB]
#include "core/dtype.h"
#include "core/error.h"
#include "core/philox.h"
#include "io/safetensors_set.h"
#include "model/hf_config.h"
#include "model/model.h"
#include "train/export.h"

#include <fcntl.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace oases;
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Drops a file's pages from the page cache, so that the next read comes from the device.
void drop_cached(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  OASES_CHECK(fd >= 0, "cannot open {}", path.string());
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_folder(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file()) drop_cached(entry.path());
}

// Reads a file start to end in 8 MB blocks; returns the bytes read.
std::uint64_t read_sequentially(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  OASES_CHECK(fd >= 0, "cannot open {}", path.string());
  std::vector<char> block(8 << 20);
  std::uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, block.data(), block.size());
    OASES_CHECK(n >= 0, "read {}", path.string());
    if (n == 0) break;
    total += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return total;
}

// Reads `from` and writes it to `to` in 8 MB blocks, then fsyncs.
void copy_sequentially(const fs::path& from, const fs::path& to) {
  const int in = ::open(from.c_str(), O_RDONLY);
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  OASES_CHECK(in >= 0 && out >= 0, "cannot open {} or {}", from.string(), to.string());
  std::vector<char> block(8 << 20);
  for (;;) {
    const ssize_t n = ::read(in, block.data(), block.size());
    OASES_CHECK(n >= 0, "read {}", from.string());
    if (n == 0) break;
    OASES_CHECK(::write(out, block.data(), static_cast<std::size_t>(n)) == n, "write {}",
                to.string());
  }
  ::fsync(out);
  ::close(in);
  ::close(out);
}

model::ModelConfig llama_1b() {
  model::ModelConfig m;
  m.arch = model::ArchitectureKind::llama;
  m.layers = 16;
  m.hidden = 2048;
  m.heads = 32;
  m.kv_heads = 8;
  m.ffn_hidden = 8192;
  m.vocab_size = 128256;
  m.seq_len = 2048;
  m.max_positions = 131072;
  m.rope_theta = 500000;
  m.rope_scaling_factor = 32;
  m.tie_embeddings = true;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/model_folder_bench", shard_size = "1GB";
  int rounds = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--dir")
      dir = argv[i + 1];
    else if (flag == "--rounds")
      rounds = std::stoi(argv[i + 1]);
    else if (flag == "--shard-size")
      shard_size = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    const fs::path root(dir), folder = root / "folder", exported = root / "exported",
                              reference = root / "reference.bin",
                              copy = root / "reference_copy.bin";
    fs::remove_all(root);
    fs::create_directories(folder);
    const model::ModelConfig m = llama_1b();
    const model::ParamLayout layout = model::model_param_layout(m);

    // The folder: random bf16 values (Philox, one stream per tensor), sharded, and config.json.
    std::vector<std::vector<std::uint16_t>> values;
    std::vector<io::TensorToWrite> tensors;
    std::uint64_t bytes = 0;
    for (const model::ParamSpec& p : layout.params()) {
      std::vector<std::uint16_t> v(static_cast<std::size_t>(p.full_shape.numel()));
      const PhiloxKey key = philox_key(7, fnv1a64(p.name));
      for (std::size_t i = 0; i < v.size(); i += 4) {
        const PhiloxCounter r = philox4x32({static_cast<std::uint32_t>(i / 4), 0, 0, 0}, key);
        for (std::size_t k = 0; k < 4 && i + k < v.size(); ++k)
          v[i + k] = float_to_bf16_bits(0.02f * (static_cast<float>(r[k] >> 8) * 0x1p-24f - 0.5f));
      }
      bytes += v.size() * 2;
      values.push_back(std::move(v));
      tensors.push_back({model::hf_tensor_name(m, p.name), DType::bf16, p.full_shape.to_vector(),
                         values.back().data()});
    }
    const auto start_make = std::chrono::steady_clock::now();
    const io::WrittenSafetensorsSet written = io::write_safetensors_set(
        folder.string(), tensors, io::parse_byte_size(shard_size, "--shard-size"),
        {{"format", "pt"}});
    std::ofstream(folder / model::kHfConfigFile)
        << model::hf_config_json(m, "bfloat16", 128000, 128001, nlohmann::json()).dump(2);
    const double make_s = seconds_since(start_make);
    values.clear();
    values.shrink_to_fit();
    // The reference file: as many bytes, written once.
    {
      std::ofstream out(reference, std::ios::binary);
      std::vector<char> block(8 << 20, 'x');
      for (std::uint64_t left = written.tensor_bytes; left > 0;) {
        const std::uint64_t n = std::min<std::uint64_t>(left, block.size());
        out.write(block.data(), static_cast<std::streamsize>(n));
        left -= n;
      }
    }
    drop_cached(reference);
    std::printf(
        "{\"parameters\": %lld, \"tensor_bytes\": %llu, \"files\": %zu, \"make_s\": %.2f}\n",
        static_cast<long long>(layout.total_numel()),
        static_cast<unsigned long long>(written.tensor_bytes), written.files.size(), make_s);

    double best_read = 1e30, best_disk_read = 1e30, best_export = 1e30, best_disk_copy = 1e30;
    std::vector<float> buffer;
    for (int round = 0; round < rounds; ++round) {
      drop_folder(folder);
      auto start = std::chrono::steady_clock::now();
      const io::SafetensorsSet set = io::SafetensorsSet::open(folder.string());
      double checksum = 0;
      for (const std::string& name : set.names()) {
        const auto& info = set.info(name);
        buffer.resize(static_cast<std::size_t>(info.numel()));
        set.read_f32(name, info.shape, buffer.data());
        checksum += buffer.front();
      }
      const double read_s = seconds_since(start);

      drop_cached(reference);
      start = std::chrono::steady_clock::now();
      const std::uint64_t read_bytes = read_sequentially(reference);
      const double disk_read_s = seconds_since(start);
      OASES_CHECK(read_bytes == written.tensor_bytes, "reference file is short");

      drop_folder(folder);
      fs::remove_all(exported);
      start = std::chrono::steady_clock::now();
      train::ExportOptions options;
      options.checkpoint = folder.string();
      options.output = exported.string();
      options.max_shard_bytes = io::parse_byte_size(shard_size, "--shard-size");
      const train::ExportSummary summary = train::export_model_folder(options);
      const double export_s = seconds_since(start);

      drop_cached(reference);
      fs::remove(copy);
      start = std::chrono::steady_clock::now();
      copy_sequentially(reference, copy);
      const double disk_copy_s = seconds_since(start);

      best_read = std::min(best_read, read_s);
      best_disk_read = std::min(best_disk_read, disk_read_s);
      best_export = std::min(best_export, export_s);
      best_disk_copy = std::min(best_disk_copy, disk_copy_s);
      const double gb = static_cast<double>(written.tensor_bytes) / 1e9;
      std::printf(
          "{\"round\": %d, \"read_folder_s\": %.2f, \"disk_read_s\": %.2f, \"read_ratio\": %.2f, "
          "\"export_s\": %.2f, \"disk_read_write_s\": %.2f, \"export_ratio\": %.2f, "
          "\"disk_read_GBps\": %.2f, \"disk_copy_GBps\": %.2f, \"export_files\": %zu, "
          "\"checksum\": %.3g}\n",
          round, read_s, disk_read_s, read_s / disk_read_s, export_s, disk_copy_s,
          export_s / disk_copy_s, gb / disk_read_s, gb / disk_copy_s, summary.files.size(),
          checksum);
      std::fflush(stdout);
    }
    std::printf(
        "{\"best\": true, \"read_folder_s\": %.2f, \"disk_read_s\": %.2f, \"read_ratio\": %.2f, "
        "\"export_s\": %.2f, \"disk_read_write_s\": %.2f, \"export_ratio\": %.2f}\n",
        best_read, best_disk_read, best_read / best_disk_read, best_export, best_disk_copy,
        best_export / best_disk_copy);
    fs::remove_all(root);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_folder: %s\n", e.what());
    return 1;
  }
  return 0;
}
