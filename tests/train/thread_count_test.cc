// A training run's results do not depend on the number of OpenMP threads: the same config and
// data trained at 1, 2 and 3 threads give bitwise-equal losses, gradient norms and parameters
// in fp32 (train.threads only changes the speed, so a run resumed on a machine with another
// core count continues exactly). The model is small but its matrix products are large enough
// for BLAS to run them on several threads, and its sizes are uneven (partial tiles everywhere).
#include "core/philox.h"
#include "kernels/cpu/gemm.h"
#include "train/engine.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace oases::train {
namespace {

plan::RunConfig small_model(const std::string& arch) {
  plan::RunConfig c;
  c.model.arch = model::parse_architecture(arch);
  c.model.layers = 2;
  c.model.hidden = 128;
  c.model.heads = 4;
  c.model.kv_heads = arch == "llama" ? 2 : 0;  // grouped-query attention
  c.model.ffn_hidden = arch == "llama" ? 352 : 512;
  c.model.vocab_size = 300;
  c.model.seq_len = 80;  // two attention blocks, the second partial
  c.model.dropout = arch == "llama" ? 0.0 : 0.1;
  c.train.micro_batch = 7;  // 560 rows: products of several gemm tiles, most of them partial
  c.train.global_batch = 14;  // two micro-batches accumulate
  c.train.steps = 3;
  c.train.lr = 1e-2;
  c.train.min_lr = 1e-3;
  c.train.warmup_steps = 1;
  c.train.grad_clip = 0.5;  // the norm is formed and the gradients scaled
  c.train.precision = "fp32";
  return c;
}

std::vector<std::int32_t> tokens(std::size_t n, std::uint32_t stream, std::int64_t vocab,
                                 bool some_ignored) {
  std::vector<std::int32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto bits = philox4x32({static_cast<std::uint32_t>(i), stream, 0, 0}, {3, 4});
    t[i] = static_cast<std::int32_t>(bits[0] % static_cast<std::uint32_t>(vocab));
    if (some_ignored && bits[1] % 4 != 0) t[i] = -1;  // masked-LM: most targets not predicted
  }
  return t;
}

struct Trajectory {
  std::vector<double> losses, grad_norms;
  std::vector<float> params;
};

// Three optimizer steps at `threads` OpenMP threads (restored afterwards). The trainer applies
// train.threads the same way, with omp_set_num_threads.
Trajectory train(const plan::RunConfig& config, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  Trajectory out;
  {
    TrainingEngine engine(config);
    const auto n = static_cast<std::size_t>(config.train.global_batch * config.model.seq_len);
    const bool mlm = config.model.masked_lm();
    for (std::int64_t step = 0; step < config.train.steps; ++step) {
      const auto in = tokens(n, static_cast<std::uint32_t>(2 * step), config.model.vocab_size,
                             false);
      const auto target = tokens(n, static_cast<std::uint32_t>(2 * step + 1),
                                 config.model.vocab_size, mlm);
      const StepResult r = engine.train_step(step, in.data(), target.data());
      out.losses.push_back(r.loss);
      out.grad_norms.push_back(r.grad_norm);
    }
    const Tensor params = engine.model().params();
    out.params.assign(params.data<float>(), params.data<float>() + params.numel());
  }
  omp_set_num_threads(saved);
  return out;
}

// Number of parameters whose bits differ.
std::int64_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  std::int64_t count = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    count += std::memcmp(&a[i], &b[i], sizeof(float)) != 0 ? 1 : 0;
  return count;
}

void expect_independent_of_thread_count(const std::string& arch) {
  const plan::RunConfig config = small_model(arch);
  // The layers' products span several tiles, so the threads share them.
  const std::int64_t rows = config.train.micro_batch * config.model.seq_len;
  ASSERT_GT(kernels::cpu::detail::gemm_tiles(rows, config.model.ffn_hidden)
                .count(rows, config.model.ffn_hidden),
            1);
  const Trajectory one = train(config, 1);
  for (const int threads : {2, 3}) {
    const Trajectory many = train(config, threads);
    for (std::size_t s = 0; s < one.losses.size(); ++s) {
      // EXPECT_EQ on doubles: bitwise equal (both finite).
      EXPECT_EQ(one.losses[s], many.losses[s]) << arch << " step " << s << " at " << threads;
      EXPECT_EQ(one.grad_norms[s], many.grad_norms[s]) << arch << " step " << s << " at "
                                                       << threads;
    }
    ASSERT_EQ(one.params.size(), many.params.size());
    EXPECT_EQ(differing(one.params, many.params), 0)
        << arch << ": parameters at " << threads << " threads differ from 1 thread";
  }
}

TEST(ThreadCount, GptTrainsBitwiseEquallyAtOneTwoAndThreeThreads) {
  expect_independent_of_thread_count("gpt");
}

TEST(ThreadCount, LlamaTrainsBitwiseEquallyAtOneTwoAndThreeThreads) {
  expect_independent_of_thread_count("llama");
}

TEST(ThreadCount, BertTrainsBitwiseEquallyAtOneTwoAndThreeThreads) {
  expect_independent_of_thread_count("bert");
}

}  // namespace
}  // namespace oases::train
