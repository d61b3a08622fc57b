// Adafactor, SM3 and SGD against fp64 references written here from the papers' update rules
// (Shazeer & Stern 2018 as Hugging Face computes it; Anil et al. 2019, SM3-II; torch.optim.SGD),
// their state (names, shapes, bytes, checkpoint round trip), the range cuts each accepts, the
// combination of statistics over shards, and the errors bad settings give.
#include "io/safetensors.h"
#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"
#include "optim/adafactor.h"
#include "optim/flat_layout.h"
#include "optim/optimizer.h"
#include "optim/shard_reducer.h"
#include "support/files.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace oases::optim {
namespace {

using oases::testing::expect_user_error;
using oases::testing::random_vector;

struct ParamSpecForTest {
  std::string name;
  std::vector<std::int64_t> shape;
  bool weight_decay;
};

// A matrix, a stack of matrices, a vector and a scalar-like vector of one, with padding
// between them (which no optimizer may touch).
const std::vector<ParamSpecForTest>& test_params() {
  static const std::vector<ParamSpecForTest> params = {
      {"h.0.attn.c_attn.weight", {6, 5}, true},
      {"h.0.mlp.c_fc.weight", {2, 3, 4}, true},
      {"h.0.ln_1.weight", {7}, false},
      {"h.0.mlp.c_proj.bias", {1}, false},
      {"wte.weight", {9, 3}, true},
  };
  return params;
}

FlatLayout test_layout(DType dtype) {
  FlatLayout layout;
  layout.dtype = dtype;
  std::int64_t offset = 3;
  for (const ParamSpecForTest& p : test_params()) {
    layout.params.push_back({p.name, offset, p.shape, p.weight_decay});
    offset = layout.params.back().end() + 5;
  }
  layout.total_numel = offset;
  return layout;
}

bool is_padding(const FlatLayout& layout, std::int64_t i) {
  for (const ParamSlot& p : layout.params)
    if (i >= p.offset && i < p.end()) return false;
  return true;
}

template <class T>
std::vector<T> random_flat(const FlatLayout& layout, std::uint64_t seed, double scale, T padding) {
  const auto values = random_vector(static_cast<std::size_t>(layout.total_numel), seed);
  std::vector<T> flat(values.size());
  for (std::size_t i = 0; i < values.size(); ++i)
    flat[i] = is_padding(layout, static_cast<std::int64_t>(i)) ? padding
                                                               : static_cast<T>(scale * values[i]);
  return flat;
}

// Gradients of step `step` (1-based): varying in size across elements and steps; NaN in the
// padding. Some elements of the vector stay exactly zero, as a gradient can.
template <class T>
std::vector<T> step_gradients(const FlatLayout& layout, std::int64_t step) {
  std::vector<T> g = random_flat<T>(layout, 100 + static_cast<std::uint64_t>(step),
                                    0.5 + 0.25 * static_cast<double>(step % 3),
                                    std::numeric_limits<T>::quiet_NaN());
  const ParamSlot& vector = layout.params[2];
  g[static_cast<std::size_t>(vector.offset + 3)] = 0;
  return g;
}

double step_lr(std::int64_t step) {
  return 0.05 / static_cast<double>(step);
}

template <class T>
Tensor flat_tensor(std::vector<T>& v) {
  return Tensor::of(v.data(), {static_cast<std::int64_t>(v.size())});
}

double rms(const std::vector<double>& x) {
  double s = 0;
  for (const double v : x) s += v * v;
  return std::sqrt(s / static_cast<double>(x.size()));
}

// One parameter of a reference: its values and shape, as [batch, rows, cols] when it has two or
// more dimensions.
struct RefParam {
  std::vector<std::int64_t> shape;
  bool decay = false;
  std::vector<double> value;
  std::int64_t batch() const {
    std::int64_t b = 1;
    for (std::size_t d = 0; d + 2 < shape.size(); ++d) b *= shape[d];
    return b;
  }
  std::int64_t rows() const { return shape[shape.size() - 2]; }
  std::int64_t cols() const { return shape.back(); }
  bool matrix() const { return shape.size() >= 2; }
};

std::vector<RefParam> ref_params(const FlatLayout& layout, const std::vector<double>& flat) {
  std::vector<RefParam> out;
  for (const ParamSlot& p : layout.params)
    out.push_back({p.shape, p.weight_decay,
                   std::vector<double>(flat.begin() + p.offset, flat.begin() + p.end())});
  return out;
}

std::vector<double> slice(const std::vector<double>& flat, const ParamSlot& p) {
  return {flat.begin() + p.offset, flat.begin() + p.end()};
}

// Adafactor, transcribed from the paper's Algorithms 4 and 5 with Hugging Face's choices
// (eps1 added to g^2, the row statistic normalised by its mean, update clipping at RMS 1,
// relative step min(1e-2, 1/sqrt(t)) x max(1e-3, RMS(W)), momentum of the scaled update,
// decoupled weight decay with the step size).
struct ReferenceAdafactor {
  double beta1 = 0, weight_decay = 0;
  bool relative = false;
  std::vector<std::vector<double>> row, col, v, m;

  void step(std::vector<RefParam>& params, const std::vector<std::vector<double>>& grads, double lr,
            std::int64_t t) {
    if (row.empty()) {
      for (const RefParam& p : params) {
        row.emplace_back(p.matrix() ? p.batch() * p.rows() : 0, 0.0);
        col.emplace_back(p.matrix() ? p.batch() * p.cols() : 0, 0.0);
        v.emplace_back(p.matrix() ? 0 : p.value.size(), 0.0);
        m.emplace_back(p.value.size(), 0.0);
      }
    }
    const double td = static_cast<double>(t);
    const double beta2 = 1 - std::pow(td, -0.8);
    for (std::size_t i = 0; i < params.size(); ++i) {
      RefParam& p = params[i];
      const std::vector<double>& g = grads[i];
      const double rho =
          relative ? std::min(1e-2, 1 / std::sqrt(td)) * std::max(1e-3, rms(p.value)) : lr;
      std::vector<double> u(g.size());
      if (p.matrix()) {
        const std::int64_t B = p.batch(), R = p.rows(), C = p.cols();
        for (std::int64_t b = 0; b < B; ++b) {
          for (std::int64_t r = 0; r < R; ++r) {
            double mean = 0;
            for (std::int64_t c = 0; c < C; ++c)
              mean += g[(b * R + r) * C + c] * g[(b * R + r) * C + c] + 1e-30;
            double& x = row[i][b * R + r];
            x = beta2 * x + (1 - beta2) * mean / static_cast<double>(C);
          }
          for (std::int64_t c = 0; c < C; ++c) {
            double mean = 0;
            for (std::int64_t r = 0; r < R; ++r)
              mean += g[(b * R + r) * C + c] * g[(b * R + r) * C + c] + 1e-30;
            double& x = col[i][b * C + c];
            x = beta2 * x + (1 - beta2) * mean / static_cast<double>(R);
          }
          double row_mean = 0;
          for (std::int64_t r = 0; r < R; ++r)
            row_mean += row[i][b * R + r] / static_cast<double>(R);
          for (std::int64_t r = 0; r < R; ++r)
            for (std::int64_t c = 0; c < C; ++c) {
              const double vhat = row[i][b * R + r] / row_mean * col[i][b * C + c];
              u[(b * R + r) * C + c] = g[(b * R + r) * C + c] / std::sqrt(vhat);
            }
        }
      } else {
        for (std::size_t j = 0; j < g.size(); ++j) {
          v[i][j] = beta2 * v[i][j] + (1 - beta2) * (g[j] * g[j] + 1e-30);
          u[j] = g[j] / std::sqrt(v[i][j]);
        }
      }
      const double clip = std::max(1.0, rms(u) / 1.0);
      for (double& x : u) x = x / clip * rho;
      if (beta1 > 0) {
        for (std::size_t j = 0; j < u.size(); ++j) {
          m[i][j] = beta1 * m[i][j] + (1 - beta1) * u[j];
          u[j] = m[i][j];
        }
      }
      for (std::size_t j = 0; j < u.size(); ++j) {
        if (p.decay) p.value[j] -= rho * weight_decay * p.value[j];
        p.value[j] -= u[j];
      }
    }
  }
};

// SM3-II (the paper's Algorithm 2 with covers = rows and columns of each matrix; diagonal
// AdaGrad for vectors), momentum as in the paper's experiments, decoupled weight decay.
struct ReferenceSm3 {
  double momentum = 0, weight_decay = 0;
  std::vector<std::vector<double>> row, col, acc, m;

  void step(std::vector<RefParam>& params, const std::vector<std::vector<double>>& grads,
            double lr) {
    if (row.empty()) {
      for (const RefParam& p : params) {
        row.emplace_back(p.matrix() ? p.batch() * p.rows() : 0, 0.0);
        col.emplace_back(p.matrix() ? p.batch() * p.cols() : 0, 0.0);
        acc.emplace_back(p.matrix() ? 0 : p.value.size(), 0.0);
        m.emplace_back(p.value.size(), 0.0);
      }
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      RefParam& p = params[i];
      const std::vector<double>& g = grads[i];
      std::vector<double> nu(g.size());
      if (p.matrix()) {
        const std::int64_t B = p.batch(), R = p.rows(), C = p.cols();
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t r = 0; r < R; ++r)
            for (std::int64_t c = 0; c < C; ++c) {
              const std::int64_t e = (b * R + r) * C + c;
              nu[e] = std::min(row[i][b * R + r], col[i][b * C + c]) + g[e] * g[e];
            }
        for (std::int64_t b = 0; b < B; ++b) {
          for (std::int64_t r = 0; r < R; ++r) {
            double mx = 0;
            for (std::int64_t c = 0; c < C; ++c) mx = std::max(mx, nu[(b * R + r) * C + c]);
            row[i][b * R + r] = mx;
          }
          for (std::int64_t c = 0; c < C; ++c) {
            double mx = 0;
            for (std::int64_t r = 0; r < R; ++r) mx = std::max(mx, nu[(b * R + r) * C + c]);
            col[i][b * C + c] = mx;
          }
        }
      } else {
        for (std::size_t j = 0; j < g.size(); ++j) nu[j] = acc[i][j] += g[j] * g[j];
      }
      for (std::size_t j = 0; j < g.size(); ++j) {
        double u = nu[j] > 0 ? g[j] / std::sqrt(nu[j]) : 0.0;
        if (momentum > 0) u = m[i][j] = momentum * m[i][j] + (1 - momentum) * u;
        if (p.decay) p.value[j] -= lr * weight_decay * p.value[j];
        p.value[j] -= lr * u;
      }
    }
  }
};

// torch.optim.SGD's documented algorithm (dampening 0).
struct ReferenceSgd {
  double momentum = 0, weight_decay = 0;
  bool nesterov = false;
  std::vector<std::vector<double>> buf;

  void step(std::vector<RefParam>& params, const std::vector<std::vector<double>>& grads, double lr,
            std::int64_t t) {
    if (buf.empty())
      for (const RefParam& p : params) buf.emplace_back(p.value.size(), 0.0);
    for (std::size_t i = 0; i < params.size(); ++i) {
      RefParam& p = params[i];
      for (std::size_t j = 0; j < p.value.size(); ++j) {
        double d = grads[i][j] + (p.decay ? weight_decay * p.value[j] : 0.0);
        if (momentum > 0) {
          buf[i][j] = t == 1 ? d : momentum * buf[i][j] + d;
          d = nesterov ? d + momentum * buf[i][j] : buf[i][j];
        }
        p.value[j] -= lr * d;
      }
    }
  }
};

void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what, double tolerance) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  EXPECT_LE(std::sqrt(diff), tolerance * std::sqrt(norm) + 1e-300)
      << what << ": relative difference " << std::sqrt(diff / std::max(norm, 1e-300));
}

// Runs `steps` steps of `optimizer` and of `reference_step` (which updates the RefParams) from
// the same start, and compares every parameter (and that the padding is untouched).
template <class T>
void expect_matches_reference(
    Optimizer& optimizer, int steps, double tolerance,
    const std::function<void(std::vector<RefParam>&, const std::vector<std::vector<double>>&,
                             double, std::int64_t)>& reference_step) {
  const FlatLayout& layout = optimizer.layout();
  const T sentinel = T(12345.5);
  std::vector<T> params = random_flat<T>(layout, 7, 1.0, sentinel);
  std::vector<RefParam> reference =
      ref_params(layout, std::vector<double>(params.begin(), params.end()));
  for (std::int64_t t = 1; t <= steps; ++t) {
    std::vector<T> grads = step_gradients<T>(layout, t);
    optimizer.step(flat_tensor(params), flat_tensor(grads), {step_lr(t), t});
    std::vector<std::vector<double>> g;
    for (const ParamSlot& p : layout.params)
      g.push_back(slice(std::vector<double>(grads.begin(), grads.end()), p));
    reference_step(reference, g, step_lr(t), t);
  }
  const std::vector<double> got(params.begin(), params.end());
  for (std::size_t i = 0; i < layout.params.size(); ++i)
    expect_close(slice(got, layout.params[i]), reference[i].value, layout.params[i].name,
                 tolerance);
  for (std::int64_t i = 0; i < layout.total_numel; ++i) {
    if (is_padding(layout, i)) {
      EXPECT_EQ(params[static_cast<std::size_t>(i)], sentinel) << i;
    }
  }
}

OptimizerConfig config_of(const std::string& name) {
  OptimizerConfig c;
  c.kind = parse_optimizer_kind(name);
  c.weight_decay = 0.1;
  return c;
}

constexpr double kFp64 = 1e-10;
// fp32 against the fp64 reference over 10 steps: the parameters and gradients start as fp32
// values (exact in both); each step rounds a few dozen operations per element (statistics,
// their running averages, the square root, the update and its clipping), each to half a unit
// in the last place, u = 2^-24 relative, on quantities no larger than the parameters; about
// half of them reach a parameter's error at full weight. Allowing 16 roundings per step,
// accumulating over the 10 steps: 10 x 16 x 2^-24 = 9.5e-6 relative.
constexpr double kFp32TenSteps = 10 * 16 * 0x1p-24;

TEST(Adafactor, MatchesThePaperInFp64WithGivenAndRelativeStepsWithAndWithoutMomentum) {
  for (const bool relative : {false, true}) {
    for (const double beta1 : {0.0, 0.9}) {
      SCOPED_TRACE(::testing::Message() << "relative " << relative << " beta1 " << beta1);
      OptimizerConfig config = config_of("adafactor");
      config.relative_step = relative;
      config.adafactor_beta1 = beta1;
      auto optimizer = make_optimizer(config, test_layout(DType::f64));
      ReferenceAdafactor reference{beta1, 0.1, relative, {}, {}, {}, {}};
      expect_matches_reference<double>(
          *optimizer, 10, kFp64,
          [&](std::vector<RefParam>& p, const std::vector<std::vector<double>>& g, double lr,
              std::int64_t t) { reference.step(p, g, relative ? 0.0 : lr, t); });
      // The factored statistics themselves.
      for (const StateTensor& s : optimizer->state_tensors()) {
        std::size_t i = 0;
        while (test_params()[i].name != s.param) ++i;
        const std::vector<double> got(s.view.data<double>(),
                                      s.view.data<double>() + s.view.numel());
        if (s.name.starts_with("exp_avg_sq_row."))
          expect_close(got, reference.row[i], s.name, kFp64);
        if (s.name.starts_with("exp_avg_sq_col."))
          expect_close(got, reference.col[i], s.name, kFp64);
        if (s.name.starts_with("exp_avg_sq.")) expect_close(got, reference.v[i], s.name, kFp64);
        if (s.name.starts_with("exp_avg.")) expect_close(got, reference.m[i], s.name, kFp64);
      }
    }
  }
}

TEST(Adafactor, Fp32StaysWithinSinglePrecisionOfTheReference) {
  OptimizerConfig config = config_of("adafactor");
  config.adafactor_beta1 = 0.9;
  auto optimizer = make_optimizer(config, test_layout(DType::f32));
  ReferenceAdafactor reference{0.9, 0.1, false, {}, {}, {}, {}};
  expect_matches_reference<float>(
      *optimizer, 10, kFp32TenSteps,
      [&](std::vector<RefParam>& p, const std::vector<std::vector<double>>& g, double lr,
          std::int64_t t) { reference.step(p, g, lr, t); });
}

TEST(Sm3, MatchesThePaperInFp64WithAndWithoutMomentum) {
  for (const double momentum : {0.0, 0.9}) {
    SCOPED_TRACE(::testing::Message() << "momentum " << momentum);
    OptimizerConfig config = config_of("sm3");
    config.momentum = momentum;
    auto optimizer = make_optimizer(config, test_layout(DType::f64));
    ReferenceSm3 reference{momentum, 0.1, {}, {}, {}, {}};
    expect_matches_reference<double>(
        *optimizer, 10, kFp64,
        [&](std::vector<RefParam>& p, const std::vector<std::vector<double>>& g, double lr,
            std::int64_t) { reference.step(p, g, lr); });
    for (const StateTensor& s : optimizer->state_tensors()) {
      std::size_t i = 0;
      while (test_params()[i].name != s.param) ++i;
      const std::vector<double> got(s.view.data<double>(), s.view.data<double>() + s.view.numel());
      if (s.name.starts_with("accumulator_row."))
        expect_close(got, reference.row[i], s.name, kFp64);
      if (s.name.starts_with("accumulator_col."))
        expect_close(got, reference.col[i], s.name, kFp64);
      if (s.name.starts_with("accumulator.")) expect_close(got, reference.acc[i], s.name, kFp64);
    }
  }
}

TEST(Sm3, Fp32StaysWithinSinglePrecisionOfTheReference) {
  OptimizerConfig config = config_of("sm3");
  config.momentum = 0.5;
  auto optimizer = make_optimizer(config, test_layout(DType::f32));
  ReferenceSm3 reference{0.5, 0.1, {}, {}, {}, {}};
  expect_matches_reference<float>(
      *optimizer, 10, kFp32TenSteps,
      [&](std::vector<RefParam>& p, const std::vector<std::vector<double>>& g, double lr,
          std::int64_t) { reference.step(p, g, lr); });
}

TEST(Sgd, MatchesTorchsAlgorithmInFp64) {
  struct Case {
    double momentum;
    bool nesterov;
  };
  for (const Case c : {Case{0.0, false}, Case{0.9, false}, Case{0.9, true}}) {
    SCOPED_TRACE(::testing::Message() << "momentum " << c.momentum << " nesterov " << c.nesterov);
    OptimizerConfig config = config_of("sgd");
    config.momentum = c.momentum;
    config.nesterov = c.nesterov;
    auto optimizer = make_optimizer(config, test_layout(DType::f64));
    ReferenceSgd reference{c.momentum, 0.1, c.nesterov, {}};
    expect_matches_reference<double>(
        *optimizer, 10, kFp64,
        [&](std::vector<RefParam>& p, const std::vector<std::vector<double>>& g, double lr,
            std::int64_t t) { reference.step(p, g, lr, t); });
  }
}

// Independent of this file's reference: the parameters torch.optim.SGD (torch 1.13, fp64)
// reaches from w = [1, -2, 0.5] with gradients g_t = [0.1 t, -0.3, 0.2 / t] at lr 0.1,
// momentum 0.9, weight decay 0.01, for 3 steps, computed by
//   w = torch.tensor([1., -2., .5], dtype=torch.float64, requires_grad=True)
//   o = torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=N)
//   for t in 1..3: w.grad = torch.tensor([0.1*t, -0.3, 0.2/t], dtype=torch.float64); o.step()
TEST(Sgd, MatchesTorchSgdOnAThreeStepTrajectory) {
  for (const bool nesterov : {false, true}) {
    FlatLayout layout;
    layout.dtype = DType::f64;
    layout.params.push_back({"w", 0, {3}, true});
    layout.total_numel = 3;
    OptimizerConfig config = config_of("sgd");
    config.momentum = 0.9;
    config.nesterov = nesterov;
    config.weight_decay = 0.01;
    auto optimizer = make_optimizer(config, layout);
    std::vector<double> w = {1.0, -2.0, 0.5};
    for (std::int64_t t = 1; t <= 3; ++t) {
      std::vector<double> g = {0.1 * static_cast<double>(t), -0.3, 0.2 / static_cast<double>(t)};
      optimizer->step(flat_tensor(w), flat_tensor(g), {0.1, t});
    }
    const std::vector<double> torch =
        nesterov
            ? std::vector<double>{0.84655001255099993, -1.742876836512, 0.38767770672383334}
            : std::vector<double>{0.89935278899999993, -1.8206335680000001, 0.41741671283333331};
    expect_close(w, torch, nesterov ? "nesterov" : "heavy ball", 1e-12);
  }
}

TEST(MemorySavingOptimizers, StepsAreBitwiseIndependentOfThreadCount) {
  FlatLayout layout = test_layout(DType::f32);
  layout.params.back().shape = {300, 80};  // large enough for the OpenMP loops
  layout.total_numel = layout.params.back().end() + 5;
  for (const std::string& name : std::vector<std::string>{"adafactor", "sm3", "sgd"}) {
    OptimizerConfig config = config_of(name);
    if (name != "adafactor") config.momentum = 0.9;
    oases::testing::expect_independent_of_thread_count(name, [&] {
      auto optimizer = make_optimizer(config, layout);
      std::vector<float> params = random_flat<float>(layout, 1, 1.0, 0.0f);
      for (std::int64_t t = 1; t <= 3; ++t) {
        std::vector<float> grads = step_gradients<float>(layout, t);
        optimizer->step(flat_tensor(params), flat_tensor(grads), {1e-2, t});
      }
      for (const StateTensor& s : optimizer->state_tensors())
        params.insert(params.end(), s.view.data<float>(), s.view.data<float>() + s.view.numel());
      return params;
    });
  }
}

TEST(MemorySavingOptimizers, StateIsNamedAndShapedLikeHuggingFacesAndCountedInBytes) {
  const FlatLayout layout = test_layout(DType::f32);
  OptimizerConfig config = config_of("adafactor");
  auto adafactor = make_optimizer(config, layout);
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const StateTensor& s : adafactor->state_tensors()) {
    shapes[s.name] = s.view.shape().to_vector();
    EXPECT_EQ(s.elementwise, s.reduced_dim < 0) << s.name;
  }
  const std::map<std::string, std::vector<std::int64_t>> expected = {
      {"exp_avg_sq_row.h.0.attn.c_attn.weight", {6}},
      {"exp_avg_sq_col.h.0.attn.c_attn.weight", {5}},
      {"exp_avg_sq_row.h.0.mlp.c_fc.weight", {2, 3}},
      {"exp_avg_sq_col.h.0.mlp.c_fc.weight", {2, 4}},
      {"exp_avg_sq.h.0.ln_1.weight", {7}},
      {"exp_avg_sq.h.0.mlp.c_proj.bias", {1}},
      {"exp_avg_sq_row.wte.weight", {9}},
      {"exp_avg_sq_col.wte.weight", {3}},
  };
  EXPECT_EQ(shapes, expected);
  // (6 + 5) + (6 + 8) + 7 + 1 + (9 + 3) values of 4 bytes.
  EXPECT_EQ(adafactor->state_bytes(), 4u * 45);
  EXPECT_DOUBLE_EQ(adafactor->state_bytes_per_parameter(),
                   4.0 * 45 / static_cast<double>(layout.param_numel()));
  config.adafactor_beta1 = 0.9;
  EXPECT_EQ(make_optimizer(config, layout)->state_bytes(),
            4u * (45 + static_cast<std::size_t>(layout.param_numel())));

  OptimizerConfig sm3 = config_of("sm3");
  EXPECT_EQ(make_optimizer(sm3, layout)->state_bytes(), 4u * 45);
  std::vector<std::string> names;
  for (const StateTensor& s : make_optimizer(sm3, layout)->state_tensors()) names.push_back(s.name);
  EXPECT_EQ(names.front(), "accumulator_row.h.0.attn.c_attn.weight");
  EXPECT_EQ(names[4], "accumulator.h.0.ln_1.weight");

  OptimizerConfig sgd = config_of("sgd");
  EXPECT_EQ(make_optimizer(sgd, layout)->state_bytes(), 0u);
  EXPECT_TRUE(make_optimizer(sgd, layout)->state_tensors().empty());
  sgd.momentum = 0.9;
  EXPECT_DOUBLE_EQ(make_optimizer(sgd, layout)->state_bytes_per_parameter(), 4.0);
  EXPECT_EQ(make_optimizer(sgd, layout)->state_tensors()[0].name,
            "momentum_buffer.h.0.attn.c_attn.weight");
  EXPECT_DOUBLE_EQ(make_optimizer(config_of("adamw"), layout)->state_bytes_per_parameter(), 8.0);
}

TEST(MemorySavingOptimizers, StateLayoutNamesWhatStateTensorsHold) {
  const FlatLayout layout = test_layout(DType::f64);
  for (const std::string& name : std::vector<std::string>{"adamw", "adafactor", "sm3", "sgd"}) {
    OptimizerConfig config = config_of(name);
    if (name == "sm3" || name == "sgd") config.momentum = 0.5;
    if (name == "adafactor") config.adafactor_beta1 = 0.5;
    auto optimizer = make_optimizer(config, layout);
    std::vector<StateTensor> laid_out;
    for (const ParamSlot& p : layout.params)
      for (StateTensor& s : optimizer->state_layout(p)) laid_out.push_back(s);
    const std::vector<StateTensor> live = optimizer->state_tensors();
    ASSERT_EQ(laid_out.size(), live.size()) << name;
    for (std::size_t i = 0; i < live.size(); ++i) {
      EXPECT_EQ(laid_out[i].name, live[i].name);
      EXPECT_EQ(laid_out[i].view.shape().to_vector(), live[i].view.shape().to_vector());
      EXPECT_EQ(laid_out[i].reduced_dim, live[i].reduced_dim);
      EXPECT_EQ(laid_out[i].view.raw(), nullptr);
    }
  }
}

// Written by name and read back into a fresh optimizer as a checkpoint does, the state
// continues bitwise.
TEST(MemorySavingOptimizers, StateRoundTripThroughSafetensorsContinuesBitwise) {
  const FlatLayout layout = test_layout(DType::f64);
  oases::testing::TempDir dir("oases_memory_saving_optimizers_test");
  for (const std::string& name : std::vector<std::string>{"adafactor", "sm3", "sgd"}) {
    OptimizerConfig config = config_of(name);
    if (name == "sm3" || name == "sgd") config.momentum = 0.5;
    if (name == "adafactor") config.adafactor_beta1 = 0.5;
    auto original = make_optimizer(config, layout);
    std::vector<double> params = random_flat<double>(layout, 3, 1.0, 0.0);
    for (std::int64_t t = 1; t <= 3; ++t) {
      std::vector<double> g = step_gradients<double>(layout, t);
      original->step(flat_tensor(params), flat_tensor(g), {step_lr(t), t});
    }
    const std::string path = dir.file(name + ".safetensors");
    io::SafetensorsWriter writer;
    for (const StateTensor& s : original->state_tensors())
      writer.add(s.name, s.view.dtype(), s.view.shape().to_vector(), s.view.raw());
    writer.write(path);
    const io::SafetensorsFile file = io::SafetensorsFile::open(path);
    auto restored = make_optimizer(config, layout);
    for (const StateTensor& s : restored->state_tensors())
      file.read_f64(s.name, s.view.shape().to_vector(), s.view.data<double>());
    std::vector<double> restored_params = params;
    for (std::int64_t t = 4; t <= 5; ++t) {
      std::vector<double> g = step_gradients<double>(layout, t);
      original->step(flat_tensor(params), flat_tensor(g), {step_lr(t), t});
      std::vector<double> g2 = step_gradients<double>(layout, t);
      restored->step(flat_tensor(restored_params), flat_tensor(g2), {step_lr(t), t});
    }
    EXPECT_EQ(std::memcmp(params.data(), restored_params.data(), params.size() * sizeof(double)), 0)
        << name;
  }
}

TEST(MemorySavingOptimizers, RangesCutOnlyWhereTheOptimizerAcceptsIt) {
  const FlatLayout layout = test_layout(DType::f64);
  const ParamSlot& matrix = layout.params[0];
  const ParamSlot& vector = layout.params[2];
  std::vector<double> params = random_flat<double>(layout, 4, 1.0, 0.0);
  std::vector<double> grads = step_gradients<double>(layout, 1);
  for (const std::string& name : std::vector<std::string>{"adafactor", "sm3"}) {
    auto optimizer = make_optimizer(config_of(name), layout);
    EXPECT_THROW(
        optimizer->step(flat_tensor(params), flat_tensor(grads), 0, matrix.offset + 7, {0.1, 1}),
        InternalError)
        << name;
  }
  EXPECT_THROW(make_optimizer(config_of("adafactor"), layout)
                   ->step(flat_tensor(params), flat_tensor(grads), 0, vector.offset + 2, {0.1, 1}),
               InternalError);
  // SM3 and SGD step a vector in pieces exactly as whole; SGD cuts matrices too.
  for (const std::string& name : std::vector<std::string>{"sm3", "sgd"}) {
    OptimizerConfig config = config_of(name);
    config.momentum = 0.5;
    auto whole = make_optimizer(config, layout);
    auto pieces = make_optimizer(config, layout);
    std::vector<double> a = params, b = params;
    const std::vector<std::int64_t> cuts =
        name == "sm3"
            ? std::vector<std::int64_t>{0, vector.offset + 2, vector.offset + 5, layout.total_numel}
            : std::vector<std::int64_t>{0, matrix.offset + 7, vector.offset + 5,
                                        layout.total_numel};
    for (std::int64_t t = 1; t <= 3; ++t) {
      std::vector<double> g = step_gradients<double>(layout, t);
      whole->step(flat_tensor(a), flat_tensor(g), {0.1, t});
      for (std::size_t r = 0; r + 1 < cuts.size(); ++r)
        pieces->step(flat_tensor(b), flat_tensor(g), cuts[r], cuts[r + 1], {0.1, t});
    }
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0) << name;
  }
}

// Shards of one parameter on threads of this process, combining statistics through memory
// in rank order, as GroupShardReducer does over a communicator.
class ThreadShardGroup {
 public:
  explicit ThreadShardGroup(int size) : barrier_(size), slots_(static_cast<std::size_t>(size)) {}

  class Reducer final : public ShardReducer {
   public:
    Reducer(ThreadShardGroup& group, int rank) : group_(group), rank_(rank) {}
    void reduce(std::size_t, Tensor values, comm::ReduceOp op) override {
      double* v = values.data<double>();
      group_.slots_[static_cast<std::size_t>(rank_)].assign(v, v + values.numel());
      group_.barrier_.arrive_and_wait();
      for (std::int64_t i = 0; i < values.numel(); ++i) {
        double x = op == comm::ReduceOp::sum ? 0.0 : -std::numeric_limits<double>::infinity();
        for (const auto& slot : group_.slots_)
          x = op == comm::ReduceOp::sum ? x + slot[static_cast<std::size_t>(i)]
                                        : std::max(x, slot[static_cast<std::size_t>(i)]);
        v[i] = x;
      }
      group_.barrier_.arrive_and_wait();
    }

   private:
    ThreadShardGroup& group_;
    int rank_;
  };

 private:
  std::barrier<> barrier_;
  std::vector<std::vector<double>> slots_;
};

// The whole parameters: a vocabulary-like matrix of 5 rows split by rows over two ranks (and
// padded to 6 rows), a matrix split by columns, a split vector, a replicated vector.
struct ShardCase {
  FlatLayout whole;
  std::vector<FlatLayout> shards;  // two
  // Element e of shard r's parameter i is element map(r, i, e) of the whole parameter (-1:
  // padding).
  std::int64_t map(int rank, std::size_t i, std::int64_t e) const {
    const ParamSlot& p = shards[static_cast<std::size_t>(rank)].params[i];
    if (i == 0) {  // rows: [3, 4] shards of [5, 4]
      const std::int64_t g = rank * 12 + e;
      return g < 20 ? g : -1;
    }
    if (i == 1) {  // columns: [4, 3] shards of [4, 6]
      return (e / 3) * 6 + rank * 3 + e % 3;
    }
    if (i == 2) return rank * p.numel() + e;  // [3] shards of [6]
    return e;
  }
};

ShardCase shard_case() {
  ShardCase c;
  c.whole.dtype = DType::f64;
  c.whole.params = {{"wte.weight", 0, {5, 4}, true},
                    {"h.0.mlp.c_fc.weight", 32, {4, 6}, true},
                    {"h.0.mlp.c_fc.bias", 64, {6}, false},
                    {"h.0.ln_1.weight", 80, {4}, false}};
  c.whole.total_numel = 96;
  for (int r = 0; r < 2; ++r) {
    FlatLayout s;
    s.dtype = DType::f64;
    s.params = {{"wte.weight", 0, {3, 4}, true, {5, 4}, 0, r == 1 ? 4 : 0},
                {"h.0.mlp.c_fc.weight", 16, {4, 3}, true, {4, 6}, 1, 0},
                {"h.0.mlp.c_fc.bias", 32, {3}, false, {6}, 0, 0},
                {"h.0.ln_1.weight", 48, {4}, false}};
    s.total_numel = 64;
    c.shards.push_back(s);
  }
  return c;
}

TEST(MemorySavingOptimizers, ShardsCombiningTheirStatisticsStepLikeTheWholeParameters) {
  const ShardCase c = shard_case();
  std::vector<OptimizerConfig> configs;
  for (const bool relative : {false, true}) {
    OptimizerConfig a = config_of("adafactor");
    a.relative_step = relative;
    a.adafactor_beta1 = relative ? 0.5 : 0.0;
    configs.push_back(a);
  }
  OptimizerConfig sm3 = config_of("sm3");
  sm3.momentum = 0.5;
  configs.push_back(sm3);
  for (const OptimizerConfig& config : configs) {
    SCOPED_TRACE(std::string(name(config.kind)) + (config.relative_step ? " relative" : ""));
    auto whole = make_optimizer(config, c.whole);
    std::vector<double> params = random_flat<double>(c.whole, 9, 1.0, 0.0);
    std::vector<std::vector<double>> shard_params(2, std::vector<double>(64, 0.0));
    const auto scatter = [&](const std::vector<double>& from, std::vector<double>& to, int r) {
      for (std::size_t i = 0; i < c.whole.params.size(); ++i) {
        const ParamSlot& s = c.shards[static_cast<std::size_t>(r)].params[i];
        for (std::int64_t e = 0; e < s.numel(); ++e) {
          const std::int64_t g = c.map(r, i, e);
          to[static_cast<std::size_t>(s.offset + e)] =
              g < 0 ? 0.0 : from[static_cast<std::size_t>(c.whole.params[i].offset + g)];
        }
      }
    };
    for (int r = 0; r < 2; ++r) scatter(params, shard_params[static_cast<std::size_t>(r)], r);
    ThreadShardGroup group(2);
    std::vector<std::unique_ptr<Optimizer>> shard_optimizers;
    for (int r = 0; r < 2; ++r)
      shard_optimizers.push_back(
          make_optimizer(config, c.shards[static_cast<std::size_t>(r)],
                         std::make_unique<ThreadShardGroup::Reducer>(group, r)));
    for (std::int64_t t = 1; t <= 5; ++t) {
      std::vector<double> grads =
          random_flat<double>(c.whole, 50 + static_cast<std::uint64_t>(t), 1.0, 0.0);
      whole->step(flat_tensor(params), flat_tensor(grads), {0.05, t});
      std::vector<std::thread> threads;
      for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
          std::vector<double> shard_grads(64, 0.0);
          scatter(grads, shard_grads, r);
          shard_optimizers[static_cast<std::size_t>(r)]->step(
              flat_tensor(shard_params[static_cast<std::size_t>(r)]), flat_tensor(shard_grads),
              {0.05, t});
        });
      }
      for (std::thread& thread : threads) thread.join();
    }
    for (int r = 0; r < 2; ++r) {
      for (std::size_t i = 0; i < c.whole.params.size(); ++i) {
        const ParamSlot& s = c.shards[static_cast<std::size_t>(r)].params[i];
        for (std::int64_t e = 0; e < s.numel(); ++e) {
          const std::int64_t g = c.map(r, i, e);
          const double got =
              shard_params[static_cast<std::size_t>(r)][static_cast<std::size_t>(s.offset + e)];
          if (g < 0) {
            EXPECT_EQ(got, 0.0) << "padding of " << s.name;
            continue;
          }
          const double want = params[static_cast<std::size_t>(c.whole.params[i].offset + g)];
          EXPECT_NEAR(got, want, 1e-12 * std::abs(want))
              << s.name << " rank " << r << " element " << e;
        }
      }
    }
  }
}

TEST(MemorySavingOptimizers, ASplitParameterWithoutAReducerIsAnInternalError) {
  const ShardCase c = shard_case();
  auto optimizer = make_optimizer(config_of("adafactor"), c.shards[0]);
  std::vector<double> params(64, 0.5), grads(64, 0.25);
  EXPECT_THROW(optimizer->step(flat_tensor(params), flat_tensor(grads), {0.1, 1}), InternalError);
}

TEST(MakeOptimizer, NamesAreTheFourOptimizers) {
  EXPECT_EQ(optimizer_names(), (std::vector<std::string_view>{"adamw", "adafactor", "sm3", "sgd"}));
  for (const std::string_view name : optimizer_names())
    EXPECT_EQ(make_optimizer(config_of(std::string(name)), test_layout(DType::f32))->name(), name);
}

TEST(MakeOptimizer, UnknownNameListsEveryValidName) {
  expect_user_error(
      [] { make_optimizer(config_of("adagrad"), test_layout(DType::f32)); },
      {"train.optimizer", "\"adagrad\"", "\"adamw\"", "\"adafactor\"", "\"sm3\"", "\"sgd\""});
}

TEST(MakeOptimizer, BadHyperParametersNameTheirKey) {
  const FlatLayout layout = test_layout(DType::f32);
  const auto expect_rejected = [&](const std::string& name, auto edit,
                                   std::vector<std::string> parts) {
    OptimizerConfig config = config_of(name);
    edit(config);
    expect_user_error([&] { make_optimizer(config, layout); }, parts);
  };
  expect_rejected("sgd", [](OptimizerConfig& c) { c.momentum = 1.0; },
                  {"train.momentum", "[0, 1)"});
  expect_rejected("sm3", [](OptimizerConfig& c) { c.momentum = -0.1; }, {"train.momentum"});
  expect_rejected("adafactor", [](OptimizerConfig& c) { c.adafactor_beta1 = 1.5; },
                  {"train.adafactor_beta1", "[0, 1)"});
  expect_rejected("sgd", [](OptimizerConfig& c) { c.nesterov = true; },
                  {"train.nesterov", "train.momentum > 0"});
  expect_rejected("adamw", [](OptimizerConfig& c) { c.momentum = 0.9; },
                  {"train.momentum = 0.9", "\"sgd\"", "\"sm3\"", "train.beta1"});
  expect_rejected("adafactor", [](OptimizerConfig& c) { c.momentum = 0.9; },
                  {"train.momentum", "train.adafactor_beta1"});
  expect_rejected("sm3", [](OptimizerConfig& c) { c.adafactor_beta1 = 0.9; },
                  {"train.adafactor_beta1", "\"adafactor\""});
  expect_rejected("sm3",
                  [](OptimizerConfig& c) {
                    c.momentum = 0.5;
                    c.nesterov = true;
                  },
                  {"train.nesterov", "\"sgd\""});
  expect_rejected("sgd", [](OptimizerConfig& c) { c.relative_step = true; },
                  {"train.lr = 0", "train.lr > 0"});
  expect_rejected("sgd", [](OptimizerConfig& c) { c.weight_decay = -1; }, {"train.weight_decay"});
}

}  // namespace
}  // namespace oases::optim
