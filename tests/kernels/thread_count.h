// Checking that a kernel's results do not depend on the number of threads.
//
// Pattern: a lambda runs the kernel on fixed inputs and returns every output (and accumulated
// gradient) as one vector; expect_independent_of_thread_count runs it at 1, 2 and 3 threads
// (and twice at 1) and requires the results to be bitwise equal. Shapes must be large enough
// for the kernel to go parallel and uneven, so that threads get unequal shares.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

// OpenBLAS, the engine's BLAS. In its OpenMP build openblas_set_num_threads also sets the
// OpenMP thread count.
extern "C" void openblas_set_num_threads(int threads);
extern "C" int openblas_get_num_threads(void);

namespace oases::testing {

// The thread counts every kernel is checked at.
inline const std::vector<int>& thread_counts() {
  static const std::vector<int> counts = {1, 2, 3};
  return counts;
}

// Sets OpenMP's and OpenBLAS's thread counts for its lifetime and restores both.
class ScopedThreadCount {
 public:
  explicit ScopedThreadCount(int threads)
      : saved_omp_(omp_get_max_threads()), saved_blas_(openblas_get_num_threads()) {
    openblas_set_num_threads(threads);
    omp_set_num_threads(threads);
  }
  ~ScopedThreadCount() {
    openblas_set_num_threads(saved_blas_);  // first: it also sets OpenMP's count
    omp_set_num_threads(saved_omp_);
  }
  ScopedThreadCount(const ScopedThreadCount&) = delete;
  ScopedThreadCount& operator=(const ScopedThreadCount&) = delete;

 private:
  int saved_omp_, saved_blas_;
};

// Elements whose bits differ (a and b of equal size; -0 and +0 differ, equal NaNs do not).
template <class T>
std::int64_t differing_bits(const std::vector<T>& a, const std::vector<T>& b) {
  std::int64_t count = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    count += std::memcmp(&a[i], &b[i], sizeof(T)) != 0 ? 1 : 0;
  return count;
}

// compute() -> std::vector<T>, run at every thread count; all results bitwise equal.
template <class Compute>
void expect_independent_of_thread_count(const std::string& what, Compute compute) {
  const auto at = [&](int threads) {
    const ScopedThreadCount scoped(threads);
    return compute();
  };
  const auto reference = at(1);
  ASSERT_FALSE(reference.empty()) << what;
  EXPECT_EQ(differing_bits(reference, at(1)), 0) << what << ": run to run at 1 thread";
  for (const int threads : thread_counts()) {
    if (threads == 1) continue;
    const auto result = at(threads);
    ASSERT_EQ(result.size(), reference.size()) << what;
    EXPECT_EQ(differing_bits(reference, result), 0)
        << what << ": elements at " << threads << " threads differ from 1 thread";
  }
}

// Appends b to a (to return several outputs as one vector).
template <class T>
void append(std::vector<T>& a, const std::vector<T>& b) {
  a.insert(a.end(), b.begin(), b.end());
}

}  // namespace oases::testing
