// Choosing OpenBLAS's kernels for this processor.
//
// OpenBLAS picks its kernels once, when the library loads, from the processor it recognises.
// Debian's OpenBLAS (0.3.21) predates recent Xeons and falls back to its generic SSE3
// "Prescott" kernels, which run sgemm about 5x slower than the AVX-512 ones on the same
// machine. OpenBLAS honours the OPENBLAS_CORETYPE environment variable, read at load time, so
// the `oases` binary re-executes itself once with the best kernel family the processor
// supports. A user's own OPENBLAS_CORETYPE is always respected.
#pragma once

#include <optional>
#include <string>

namespace oases::kernels::cpu {

// Name of the kernel family OpenBLAS is using (e.g. "SkylakeX", "Prescott").
std::string openblas_core_name();

// OpenBLAS's own description of its build and kernels, e.g. "OpenBLAS 0.3.21 NO_AFFINITY
// Haswell MAX_THREADS=64".
std::string openblas_description();

// The oneDNN library loaded, e.g. "oneDNN 2.7.3".
std::string onednn_version();

// The OPENBLAS_CORETYPE to use instead of the current one, when OpenBLAS fell back to a
// generic family on a processor with AVX-512 or AVX2+FMA; nullopt when nothing is to gain or
// the user set OPENBLAS_CORETYPE.
std::optional<std::string> better_openblas_core();

// If better_openblas_core() names a family, sets OPENBLAS_CORETYPE and re-executes the current
// program with the same arguments (does not return on success). Otherwise returns.
void reexec_with_better_openblas_core(char** argv);

}  // namespace oases::kernels::cpu
