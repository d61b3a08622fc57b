// The kernels' front door times each call into the calling thread's TimeBreakdown
// (core/time_breakdown.h) while a scope installs one, in the call's category, and never
// otherwise.
#include "core/buffer.h"
#include "core/time_breakdown.h"
#include "kernels/kernels.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace oases::kernels {
namespace {

// Small f32 operands for one call of each category.
struct Operands {
  std::vector<float> x = std::vector<float>(4 * 8, 0.5f);
  std::vector<float> w = std::vector<float>(8 * 8, 0.25f);
  std::vector<float> y = std::vector<float>(4 * 8, 0.0f);
  std::vector<float> ones = std::vector<float>(8, 1.0f);
  std::vector<float> zeros = std::vector<float>(8, 0.0f);
  std::vector<float> stats = std::vector<float>(4 * 2, 0.0f);
  Tensor x_t() { return Tensor::of(x.data(), {4, 8}); }
  Tensor w_t() { return Tensor::of(w.data(), {8, 8}); }
  Tensor y_t() { return Tensor::of(y.data(), {4, 8}); }
  Tensor gamma() { return Tensor::of(ones.data(), {8}); }
  Tensor beta() { return Tensor::of(zeros.data(), {8}); }
  Tensor mean() { return Tensor::of(stats.data(), {4}); }
  Tensor rstd() { return Tensor::of(stats.data() + 4, {4}); }
};

void one_product(Operands& o) {
  linear_forward(o.x_t(), o.w_t(), WeightLayout::in_out, Tensor(), o.y_t());
}

std::int64_t total_calls(const TimeBreakdown& t) {
  std::int64_t n = 0;
  for (const std::int64_t c : t.calls) n += c;
  return n;
}

TEST(TimeBreakdown, CountsEachCallInItsCategory) {
  Operands o;
  TimeBreakdown times;
  {
    const TimeBreakdownScope scope(times);
    one_product(o);
    one_product(o);
    layernorm_forward(o.x_t(), o.gamma(), o.beta(), o.y_t(), o.mean(), o.rstd(), 1e-5);
    gelu_forward(o.x_t(), o.y_t(), GeluForm::tanh);
    add(o.x_t(), o.y_t(), o.y_t());
    std::vector<BFloat16> half(o.x.size());
    convert(o.x_t(), Tensor::of(half.data(), {4, 8}));
    const Buffer buffer(4096);
  }
  EXPECT_EQ(times.calls_of(TimeCategory::products), 2);
  EXPECT_EQ(times.calls_of(TimeCategory::norms), 1);
  EXPECT_EQ(times.calls_of(TimeCategory::elementwise), 2);
  EXPECT_EQ(times.calls_of(TimeCategory::conversions), 1);
  EXPECT_EQ(times.calls_of(TimeCategory::allocation), 2);  // created and released
  EXPECT_EQ(times.calls_of(TimeCategory::attention), 0);
  EXPECT_EQ(times.calls_of(TimeCategory::head), 0);
  EXPECT_EQ(times.calls_of(TimeCategory::optimizer), 0);
  EXPECT_GT(times.seconds_of(TimeCategory::products), 0.0);
  EXPECT_EQ(times.seconds_of(TimeCategory::attention), 0.0);
  EXPECT_DOUBLE_EQ(times.total_seconds(),
                   times.seconds_of(TimeCategory::products) +
                       times.seconds_of(TimeCategory::norms) +
                       times.seconds_of(TimeCategory::elementwise) +
                       times.seconds_of(TimeCategory::conversions) +
                       times.seconds_of(TimeCategory::allocation));
  EXPECT_EQ(times.open_sections, 0);
}

TEST(TimeBreakdown, CountsNothingWithoutAScopeOrAfterItEnds) {
  Operands o;
  EXPECT_EQ(installed_time_breakdown(), nullptr);
  TimeBreakdown times;
  one_product(o);  // before the scope
  {
    const TimeBreakdownScope scope(times);
    EXPECT_EQ(installed_time_breakdown(), &times);
    one_product(o);
  }
  EXPECT_EQ(installed_time_breakdown(), nullptr);
  one_product(o);  // after it
  const Buffer buffer(64);
  EXPECT_EQ(times.calls_of(TimeCategory::products), 1);
  EXPECT_EQ(total_calls(times), 1);
}

TEST(TimeBreakdown, AttributionScopeCountsKernelsAsItsCategoryButNotAllocation) {
  Operands o;
  TimeBreakdown times;
  {
    const TimeBreakdownScope scope(times);
    {
      const TimeAttributionScope head(TimeCategory::head);
      one_product(o);
      const Buffer buffer(64);
    }
    one_product(o);  // the attribution ended
  }
  EXPECT_EQ(times.calls_of(TimeCategory::head), 1);
  EXPECT_EQ(times.calls_of(TimeCategory::products), 1);
  EXPECT_EQ(times.calls_of(TimeCategory::allocation), 2);
  EXPECT_FALSE(times.attributing);
}

TEST(TimeBreakdown, AttributionWithoutASinkDoesNothing) {
  Operands o;
  const TimeAttributionScope head(TimeCategory::head);
  one_product(o);
  EXPECT_EQ(installed_time_breakdown(), nullptr);
}

TEST(TimeBreakdown, NestedSectionsCountOnceAndNestedScopesRestoreTheOuterSink) {
  TimeBreakdown outer, inner;
  {
    const TimeBreakdownScope outer_scope(outer);
    {
      const TimedSection section(TimeCategory::optimizer);
      const TimedSection nested(TimeCategory::products);  // counted by the outer section
    }
    {
      const TimeBreakdownScope inner_scope(inner);
      const TimedSection section(TimeCategory::attention);
    }
    EXPECT_EQ(installed_time_breakdown(), &outer);
  }
  EXPECT_EQ(outer.calls_of(TimeCategory::optimizer), 1);
  EXPECT_EQ(total_calls(outer), 1);
  EXPECT_EQ(inner.calls_of(TimeCategory::attention), 1);
  EXPECT_EQ(total_calls(inner), 1);
}

TEST(TimeBreakdown, CategoriesHaveTheirNames) {
  EXPECT_EQ(time_category_name(TimeCategory::products), "products");
  EXPECT_EQ(time_category_name(TimeCategory::head), "head");
  EXPECT_EQ(time_category_name(TimeCategory::allocation), "allocation");
}

}  // namespace
}  // namespace oases::kernels
