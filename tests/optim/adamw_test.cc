#include "optim/adamw.h"

#include "core/error.h"
#include "io/safetensors.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/finite_difference.h"
#include "kernels/thread_count.h"
#include "optim/flat_layout.h"
#include "optim/optimizer.h"
#include "support/files.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace oases::optim {
namespace {

using oases::testing::expect_user_error;
using oases::testing::random_vector;

// Parameters shaped like a small GPT's, with alignment padding between some of them and at
// the end. wte is large enough for the AdamW kernel to run its OpenMP loop.
FlatLayout test_layout(DType dtype) {
  struct Spec {
    const char* name;
    std::vector<std::int64_t> shape;
    bool weight_decay;
    std::int64_t padding_after;
  };
  const std::vector<Spec> specs = {
      {"wte.weight", {130, 150}, true, 12},          {"h.0.ln_1.weight", {37}, false, 3},
      {"h.0.attn.c_attn.weight", {16, 48}, true, 0}, {"h.0.attn.c_attn.bias", {48}, false, 0},
      {"h.0.mlp.c_fc.weight", {16, 5, 3}, true, 7},  {"ln_f.bias", {5}, false, 11},
  };
  FlatLayout layout;
  layout.dtype = dtype;
  std::int64_t offset = 0;
  for (const Spec& s : specs) {
    layout.params.push_back({s.name, offset, s.shape, s.weight_decay});
    offset = layout.params.back().end() + s.padding_after;
  }
  layout.total_numel = offset;
  return layout;
}

OptimizerConfig test_config() {
  OptimizerConfig config;
  config.beta1 = 0.9;
  config.beta2 = 0.95;
  config.eps = 1e-8;
  config.weight_decay = 0.1;
  return config;
}

// Values that are never written by an optimizer step, to see that padding is left alone.
template <class T>
constexpr T kPaddingSentinel = T(12345.5);

bool is_padding(const FlatLayout& layout, std::int64_t i) {
  for (const ParamSlot& p : layout.params)
    if (i >= p.offset && i < p.end()) return false;
  return true;
}

// A flat array of the layout with random parameter elements (`seed`) and `padding` between.
template <class T>
std::vector<T> random_flat(const FlatLayout& layout, std::uint64_t seed, double lo, double hi,
                           T padding) {
  const auto values = random_vector(static_cast<std::size_t>(layout.total_numel), seed, lo, hi);
  std::vector<T> flat(values.begin(), values.end());
  for (std::int64_t i = 0; i < layout.total_numel; ++i)
    if (is_padding(layout, i)) flat[static_cast<std::size_t>(i)] = padding;
  return flat;
}

// The gradients of step `step`: different every step, NaN in the padding (which an optimizer
// must not read into anything it writes).
template <class T>
std::vector<T> step_gradients(const FlatLayout& layout, std::int64_t step) {
  return random_flat<T>(layout, 1000 + static_cast<std::uint64_t>(step), -2.0, 2.0,
                        std::numeric_limits<T>::quiet_NaN());
}

// The learning rate of step `step`: it changes from step to step, as under a schedule.
double step_lr(std::int64_t step) {
  return 1e-2 / static_cast<double>(step + 1);
}

template <class T>
Tensor flat_tensor(std::vector<T>& flat) {
  return Tensor::of(flat.data(), {static_cast<std::int64_t>(flat.size())});
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The AdamW update as TrainingEngine ran it before optim/ existed (src/train/engine.cc,
// TrainingEngine::apply_adamw; the moments were flat arrays indexed like the parameters, and
// `step` counted from 0). optim::AdamW must reproduce it bit for bit.
template <class T>
struct OldEngineAdamW {
  FlatLayout layout;
  OptimizerConfig t;
  std::vector<T> exp_avg = std::vector<T>(static_cast<std::size_t>(layout.total_numel), T(0));
  std::vector<T> exp_avg_sq = std::vector<T>(static_cast<std::size_t>(layout.total_numel), T(0));

  void apply_adamw(T* params, const T* grads, std::int64_t step, double lr) {
    namespace k = oases::kernels::cpu;
    for (const auto& p : layout.params) {
      k::AdamWStep hp{lr, t.beta1, t.beta2, t.eps, p.weight_decay ? t.weight_decay : 0.0, step + 1};
      k::adamw_update(params + p.offset, grads + p.offset, exp_avg.data() + p.offset,
                      exp_avg_sq.data() + p.offset, p.numel(), hp);
    }
  }
};

// Every state view of `optimizer` holds the reference's moments for its parameter, bitwise.
template <class T>
void expect_state_equals(Optimizer& optimizer, const OldEngineAdamW<T>& reference) {
  for (const StateTensor& s : optimizer.state_tensors()) {
    const ParamSlot* slot = nullptr;
    for (const ParamSlot& p : reference.layout.params)
      if (p.name == s.param) slot = &p;
    ASSERT_NE(slot, nullptr) << s.name;
    const bool first = s.name.rfind("exp_avg.", 0) == 0;
    const std::vector<T>& moment = first ? reference.exp_avg : reference.exp_avg_sq;
    EXPECT_EQ(std::memcmp(s.view.data<T>(), moment.data() + slot->offset,
                          static_cast<std::size_t>(slot->numel()) * sizeof(T)),
              0)
        << s.name;
  }
}

template <class T>
class AdamWTest : public ::testing::Test {
 protected:
  static constexpr DType kDType = dtype_of<T>::value;
};
using Floats = ::testing::Types<float, double>;
TYPED_TEST_SUITE(AdamWTest, Floats);

TYPED_TEST(AdamWTest, WholeLayoutStepsMatchTheOldEngineLoopBitwise) {
  using T = TypeParam;
  const FlatLayout layout = test_layout(TestFixture::kDType);
  auto optimizer = make_optimizer(test_config(), layout);
  OldEngineAdamW<T> reference{layout, test_config()};
  std::vector<T> params = random_flat<T>(layout, 1, -1.0, 1.0, kPaddingSentinel<T>);
  std::vector<T> expected = params;
  for (std::int64_t step = 0; step < 6; ++step) {
    std::vector<T> grads = step_gradients<T>(layout, step);
    optimizer->step(flat_tensor(params), flat_tensor(grads), {step_lr(step), step + 1});
    reference.apply_adamw(expected.data(), grads.data(), step, step_lr(step));
    ASSERT_TRUE(same_bits(params, expected)) << "after step " << step;
  }
  expect_state_equals(*optimizer, reference);
  for (std::int64_t i = 0; i < layout.total_numel; ++i) {
    if (is_padding(layout, i)) {
      EXPECT_EQ(params[static_cast<std::size_t>(i)], kPaddingSentinel<T>) << "element " << i;
    }
  }
}

// Parameters and both moments after several steps are bitwise equal at 1, 2 and 3 threads.
TYPED_TEST(AdamWTest, StepsAreBitwiseIndependentOfThreadCount) {
  using T = TypeParam;
  const FlatLayout layout = test_layout(TestFixture::kDType);
  oases::testing::expect_independent_of_thread_count("AdamW", [&] {
    auto optimizer = make_optimizer(test_config(), layout);
    std::vector<T> params = random_flat<T>(layout, 1, -1.0, 1.0, kPaddingSentinel<T>);
    for (std::int64_t step = 0; step < 3; ++step) {
      std::vector<T> grads = step_gradients<T>(layout, step);
      optimizer->step(flat_tensor(params), flat_tensor(grads), {step_lr(step), step + 1});
    }
    for (const StateTensor& state : optimizer->state_tensors())
      params.insert(params.end(), state.view.data<T>(), state.view.data<T>() + state.view.numel());
    return params;
  });
}

TYPED_TEST(AdamWTest, RangesThatCutParametersMatchTheOldEngineLoopBitwise) {
  using T = TypeParam;
  const FlatLayout layout = test_layout(TestFixture::kDType);
  const std::int64_t ln_1 = layout.params[1].offset;
  // Cuts inside wte, exactly at wte's end, inside the padding after it, inside ln_1, an
  // empty range, a range of one element, and the rest; ranks of a ZeRO group would each own
  // one of them.
  const std::vector<std::int64_t> cuts = {
      0, 7, 19500, 19505, ln_1 + 10, ln_1 + 10, ln_1 + 11, 20000, layout.total_numel};
  ASSERT_EQ(layout.params[0].end(), 19500);
  auto optimizer = make_optimizer(test_config(), layout);
  OldEngineAdamW<T> reference{layout, test_config()};
  std::vector<T> params = random_flat<T>(layout, 2, -1.0, 1.0, kPaddingSentinel<T>);
  std::vector<T> expected = params;
  for (std::int64_t step = 0; step < 5; ++step) {
    std::vector<T> grads = step_gradients<T>(layout, step);
    // Every other step walks the ranges backwards: the order of the ranges does not matter.
    for (std::size_t r = 0; r + 1 < cuts.size(); ++r) {
      const std::size_t i = step % 2 == 0 ? r : cuts.size() - 2 - r;
      optimizer->step(flat_tensor(params), flat_tensor(grads), cuts[i], cuts[i + 1],
                      {step_lr(step), step + 1});
    }
    reference.apply_adamw(expected.data(), grads.data(), step, step_lr(step));
    ASSERT_TRUE(same_bits(params, expected)) << "after step " << step;
  }
  expect_state_equals(*optimizer, reference);
}

TYPED_TEST(AdamWTest, ARangeUpdatesOnlyItsOwnElements) {
  using T = TypeParam;
  const FlatLayout layout = test_layout(TestFixture::kDType);
  auto optimizer = make_optimizer(test_config(), layout);
  std::vector<T> params = random_flat<T>(layout, 3, -1.0, 1.0, kPaddingSentinel<T>);
  const std::vector<T> before = params;
  std::vector<T> grads = step_gradients<T>(layout, 0);
  const std::int64_t begin = 19000, end = layout.params[2].offset + 5;  // wte's tail to c_attn
  optimizer->step(flat_tensor(params), flat_tensor(grads), begin, end, {1e-2, 1});
  for (std::int64_t i = 0; i < layout.total_numel; ++i) {
    const auto u = static_cast<std::size_t>(i);
    const bool updated = i >= begin && i < end && !is_padding(layout, i);
    if (updated) {
      EXPECT_NE(params[u], before[u]) << "element " << i;
    } else {
      EXPECT_EQ(std::memcmp(&params[u], &before[u], sizeof(T)), 0) << "element " << i;
    }
  }
  // The state outside the range is still zero: the next step there is a first step.
  for (const StateTensor& s : optimizer->state_tensors()) {
    if (s.param != "h.0.attn.c_attn.bias") continue;
    for (std::int64_t i = 0; i < s.view.numel(); ++i) EXPECT_EQ(s.view.data<T>()[i], T(0));
  }
}

TYPED_TEST(AdamWTest, StateRoundTripThroughSafetensorsContinuesBitwise) {
  using T = TypeParam;
  const FlatLayout layout = test_layout(TestFixture::kDType);
  oases::testing::TempDir dir("oases_adamw_test");
  const std::string path = dir.file("optimizer.safetensors");

  auto original = make_optimizer(test_config(), layout);
  std::vector<T> params = random_flat<T>(layout, 4, -1.0, 1.0, kPaddingSentinel<T>);
  for (std::int64_t step = 0; step < 3; ++step) {
    std::vector<T> grads = step_gradients<T>(layout, step);
    original->step(flat_tensor(params), flat_tensor(grads), {step_lr(step), step + 1});
  }
  // Written as a checkpoint writer does: every state tensor by name, knowing nothing of AdamW.
  io::SafetensorsWriter writer;
  for (const StateTensor& s : original->state_tensors())
    writer.add(s.name, s.view.dtype(), s.view.shape().to_vector(), s.view.raw());
  writer.write(path);

  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  std::set<std::string> expected_names;
  for (const ParamSlot& p : layout.params) {
    expected_names.insert("exp_avg." + p.name);
    expected_names.insert("exp_avg_sq." + p.name);
  }
  const std::vector<std::string> names = file.names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected_names);

  auto restored = make_optimizer(test_config(), layout);
  for (const StateTensor& s : restored->state_tensors()) {
    const io::SafetensorsTensorInfo& info = file.info(s.name);
    ASSERT_EQ(info.dtype, layout.dtype) << s.name;
    ASSERT_EQ(info.shape, s.view.shape().to_vector()) << s.name;
    if constexpr (std::is_same_v<T, float>) {
      file.read_f32(s.name, s.view.shape().to_vector(), s.view.data<float>());
    } else {
      const std::vector<std::byte> bytes = file.read_raw(s.name);
      ASSERT_EQ(bytes.size(), s.view.nbytes()) << s.name;
      std::memcpy(s.view.raw(), bytes.data(), bytes.size());
    }
  }

  std::vector<T> restored_params = params;
  for (std::int64_t step = 3; step < 5; ++step) {
    std::vector<T> grads = step_gradients<T>(layout, step);
    original->step(flat_tensor(params), flat_tensor(grads), {step_lr(step), step + 1});
    restored->step(flat_tensor(restored_params), flat_tensor(grads), {step_lr(step), step + 1});
  }
  EXPECT_TRUE(same_bits(params, restored_params));
  const auto a = original->state_tensors(), b = restored->state_tensors();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i].view.raw(), b[i].view.raw(), a[i].view.nbytes()), 0) << a[i].name;
}

TYPED_TEST(AdamWTest, StateBytesAreTwoValuesPerParameterElementWithoutPadding) {
  using T = TypeParam;
  const FlatLayout layout = test_layout(TestFixture::kDType);
  auto optimizer = make_optimizer(test_config(), layout);
  EXPECT_DOUBLE_EQ(optimizer->state_bytes_per_parameter(), static_cast<double>(2 * sizeof(T)));
  std::int64_t param_elements = 0;
  for (const ParamSlot& p : layout.params) param_elements += p.numel();
  ASSERT_LT(param_elements, layout.total_numel);  // the layout has padding
  EXPECT_EQ(layout.param_numel(), param_elements);
  EXPECT_EQ(optimizer->state_bytes(), 2 * sizeof(T) * static_cast<std::size_t>(param_elements));
  std::size_t viewed = 0;
  for (const StateTensor& s : optimizer->state_tensors()) viewed += s.view.nbytes();
  EXPECT_EQ(viewed, optimizer->state_bytes());
}

TYPED_TEST(AdamWTest, StateTensorsAreNamedAndShapedLikeTheirParameters) {
  using T = TypeParam;
  const FlatLayout layout = test_layout(TestFixture::kDType);
  auto optimizer = make_optimizer(test_config(), layout);
  EXPECT_EQ(optimizer->name(), "adamw");
  const std::vector<StateTensor> state = optimizer->state_tensors();
  ASSERT_EQ(state.size(), 2 * layout.params.size());
  for (std::size_t i = 0; i < layout.params.size(); ++i) {
    const ParamSlot& p = layout.params[i];
    const StateTensor& m = state[2 * i];
    const StateTensor& v = state[2 * i + 1];
    EXPECT_EQ(m.name, "exp_avg." + p.name);
    EXPECT_EQ(v.name, "exp_avg_sq." + p.name);
    for (const StateTensor* s : {&m, &v}) {
      EXPECT_EQ(s->param, p.name);
      EXPECT_EQ(s->view.dtype(), layout.dtype);
      EXPECT_EQ(s->view.shape().to_vector(), p.shape);
      EXPECT_TRUE(s->elementwise);
      for (std::int64_t j = 0; j < s->view.numel(); ++j) EXPECT_EQ(s->view.data<T>()[j], T(0));
    }
  }
  // No two views share memory: each is the state of its own parameter and kind.
  for (std::size_t i = 0; i < state.size(); ++i) {
    for (std::size_t j = i + 1; j < state.size(); ++j) {
      const auto* a = static_cast<const char*>(state[i].view.raw());
      const auto* b = static_cast<const char*>(state[j].view.raw());
      EXPECT_TRUE(a + state[i].view.nbytes() <= b || b + state[j].view.nbytes() <= a)
          << state[i].name << " overlaps " << state[j].name;
    }
  }
}

TEST(MakeOptimizer, UnknownNameIsAUserErrorNamingTheSettingAndTheValidNames) {
  expect_user_error([&] { parse_optimizer_kind("lion"); },
                    {"train.optimizer", "\"lion\"", "\"adamw\""});
}

TEST(MakeOptimizer, HyperParametersOutOfRangeAreUserErrorsNamingTheSetting) {
  const FlatLayout layout = test_layout(DType::f32);
  const auto expect_rejected = [&](auto edit, const std::string& setting) {
    OptimizerConfig config = test_config();
    edit(config);
    expect_user_error([&] { make_optimizer(config, layout); }, {setting});
  };
  expect_rejected([](OptimizerConfig& c) { c.beta1 = 1.0; }, "train.beta1");
  expect_rejected([](OptimizerConfig& c) { c.beta2 = -0.5; }, "train.beta2");
  expect_rejected([](OptimizerConfig& c) { c.eps = -1e-8; }, "train.eps");
  expect_rejected([](OptimizerConfig& c) { c.weight_decay = -0.1; }, "train.weight_decay");
}

TEST(MakeOptimizer, NamesListAdamWFirst) {
  EXPECT_EQ(optimizer_names().front(), "adamw");
}

TEST(FlatLayout, BrokenLayoutsAreInternalErrors) {
  const auto expect_broken = [](const char* what, auto edit) {
    SCOPED_TRACE(what);
    FlatLayout layout = test_layout(DType::f32);
    edit(layout);
    EXPECT_THROW(make_optimizer(test_config(), layout), InternalError);
  };
  expect_broken("bf16", [](FlatLayout& l) { l.dtype = DType::bf16; });
  expect_broken("i32", [](FlatLayout& l) { l.dtype = DType::i32; });
  expect_broken("overlap", [](FlatLayout& l) { l.params[1].offset = l.params[0].end() - 1; });
  expect_broken("order", [](FlatLayout& l) { std::swap(l.params[2], l.params[3]); });
  expect_broken("past the end", [](FlatLayout& l) { l.total_numel = l.params.back().end() - 1; });
  expect_broken("same name", [](FlatLayout& l) { l.params[3].name = l.params[2].name; });
  expect_broken("no name", [](FlatLayout& l) { l.params[3].name.clear(); });
  expect_broken("negative dimension", [](FlatLayout& l) { l.params[3].shape = {-1}; });
  expect_broken("five dimensions", [](FlatLayout& l) { l.params[3].shape = {1, 1, 1, 1, 48}; });
}

TEST(FlatLayout, ParamSlicesAreTheIntersectionsWithTheRange) {
  const FlatLayout layout = test_layout(DType::f32);
  const std::int64_t ln_1 = layout.params[1].offset, c_attn = layout.params[2].offset;
  std::vector<std::tuple<std::size_t, std::int64_t, std::int64_t>> slices;
  for_each_param_slice(
      layout, 19400, c_attn + 3,
      [&](std::size_t i, std::int64_t lo, std::int64_t hi) { slices.emplace_back(i, lo, hi); });
  const std::vector<std::tuple<std::size_t, std::int64_t, std::int64_t>> expected = {
      {0, 19400, 19500}, {1, ln_1, ln_1 + 37}, {2, c_attn, c_attn + 3}};
  EXPECT_EQ(slices, expected);
  slices.clear();
  // Inside padding only, and empty.
  for_each_param_slice(layout, 19501, 19510, [&](std::size_t i, std::int64_t lo, std::int64_t hi) {
    slices.emplace_back(i, lo, hi);
  });
  for_each_param_slice(layout, 50, 50, [&](std::size_t i, std::int64_t lo, std::int64_t hi) {
    slices.emplace_back(i, lo, hi);
  });
  EXPECT_TRUE(slices.empty());
}

TEST(Optimizer, StepWithArraysThatDoNotMatchTheLayoutIsAnInternalError) {
  const FlatLayout layout = test_layout(DType::f32);
  auto optimizer = make_optimizer(test_config(), layout);
  const auto n = static_cast<std::size_t>(layout.total_numel);
  std::vector<float> params(n, 0.5f), grads(n, 0.25f), short_grads(n - 1, 0.25f);
  std::vector<double> grads64(n, 0.25);
  const StepInfo info{1e-3, 1};
  EXPECT_THROW(optimizer->step(flat_tensor(params), flat_tensor(grads64), info), InternalError);
  EXPECT_THROW(optimizer->step(flat_tensor(params), flat_tensor(short_grads), info), InternalError);
  EXPECT_THROW(optimizer->step(flat_tensor(params), flat_tensor(params), info), InternalError);
  const auto total = layout.total_numel;
  EXPECT_THROW(optimizer->step(flat_tensor(params), flat_tensor(grads), -1, 5, info),
               InternalError);
  EXPECT_THROW(optimizer->step(flat_tensor(params), flat_tensor(grads), 6, 5, info), InternalError);
  EXPECT_THROW(optimizer->step(flat_tensor(params), flat_tensor(grads), 0, total + 1, info),
               InternalError);
  EXPECT_THROW(optimizer->step(flat_tensor(params), flat_tensor(grads), {1e-3, 0}), InternalError);
  EXPECT_THROW(optimizer->step(flat_tensor(params), flat_tensor(grads), {-1e-3, 1}), InternalError);
}

TEST(Optimizer, AnEmptyLayoutStepsAndHoldsNoState) {
  FlatLayout layout;
  auto optimizer = make_optimizer(test_config(), layout);
  optimizer->step(Tensor(nullptr, DType::f32, Shape{0}), Tensor(nullptr, DType::f32, Shape{0}),
                  {1e-3, 1});
  EXPECT_EQ(optimizer->state_bytes(), 0u);
  EXPECT_TRUE(optimizer->state_tensors().empty());
}

}  // namespace
}  // namespace oases::optim
