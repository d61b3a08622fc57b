#include "kernels/cpu/blas_runtime.h"

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstdlib>
#include <cstring>
#include <unistd.h>

extern "C" char* openblas_get_corename(void);
extern "C" char* openblas_get_config(void);

namespace oases::kernels::cpu {

std::string openblas_core_name() {
  const char* name = openblas_get_corename();
  return name ? name : "";
}

std::string openblas_description() {
  const char* config = openblas_get_config();
  return config ? config : "OpenBLAS";
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("oneDNN {}.{}.{}", v->major, v->minor, v->patch);
}

std::optional<std::string> better_openblas_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return std::nullopt;
  const std::string current = openblas_core_name();
  // The families OpenBLAS falls back to for processors it does not know.
  const bool generic = current == "Prescott" || current == "Core2" || current == "Nehalem" ||
                       current == "Unknown" || current == "Sandybridge";
  if (!generic) return std::nullopt;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return std::nullopt;
}

void reexec_with_better_openblas_core(char** argv) {
  const auto core = better_openblas_core();
  if (!core) return;
  setenv("OPENBLAS_CORETYPE", core->c_str(), 1);
  execv("/proc/self/exe", argv);
  // execv failed (no /proc?): carry on with the kernels already loaded.
}

}  // namespace oases::kernels::cpu
