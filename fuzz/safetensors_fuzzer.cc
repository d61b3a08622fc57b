// libFuzzer target: io::SafetensorsFile (open, then every read) on arbitrary file contents.
//
// Accepted files must keep the promises of io/safetensors.h: every listed tensor has info,
// read_raw returns exactly its byte size, floating-point tensors read as f32 and f64 and
// integer ones are refused with a UserError, and a name that is not there is a UserError.
#include "fuzz_support.h"
#include "io/safetensors.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {

using oases::DType;
using oases::fuzz::accepts;
using oases::fuzz::require;

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16;
}

void read_everything(const oases::io::SafetensorsFile& file) {
  for (const std::string& name : file.names()) {
    require(file.has(name), "names() lists a tensor that has() denies");
    const oases::io::SafetensorsTensorInfo& info = file.info(name);
    const std::vector<std::byte> raw = file.read_raw(name);
    require(raw.size() == info.nbytes(), "read_raw returned another size than data_offsets");
    const auto numel = static_cast<std::size_t>(info.numel());
    require(numel * oases::dtype_size(info.dtype) == info.nbytes(),
            "numel x element size differs from the tensor's byte size");
    std::vector<float> as_f32(numel);
    std::vector<double> as_f64(numel);
    const bool read32 = accepts([&] { file.read_f32(name, info.shape, as_f32.data()); });
    const bool read64 = accepts([&] { file.read_f64(name, info.shape, as_f64.data()); });
    require(read32 == is_floating(info.dtype) && read64 == is_floating(info.dtype),
            "read_f32/read_f64 accept exactly the floating-point dtypes");
    std::vector<std::int64_t> other_shape = info.shape;
    other_shape.push_back(1);
    require(!accepts([&] { file.read_f64(name, other_shape, as_f64.data()); }),
            "read_f64 accepted a tensor under another shape");
  }
  require(!accepts([&] { (void)file.info("\x01 not a tensor name"); }),
          "info() of an absent tensor did not throw UserError");
  for (const auto& [key, value] : file.metadata()) (void)value.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const oases::fuzz::ScratchFile scratch("safetensors");
  scratch.write(data, size);
  accepts([&] { read_everything(oases::io::SafetensorsFile::open(scratch.path())); });
  return 0;
}
