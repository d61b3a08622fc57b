#include "core/time_breakdown.h"

#include <numeric>

namespace oases {
namespace {
// The sink of this thread's open TimeBreakdownScope (core/time_breakdown.h says why this is
// thread-local); null outside every scope.
thread_local TimeBreakdown* installed = nullptr;
}  // namespace

std::string_view time_category_name(TimeCategory category) {
  switch (category) {
    case TimeCategory::products: return "products";
    case TimeCategory::attention: return "attention";
    case TimeCategory::norms: return "norms";
    case TimeCategory::head: return "head";
    case TimeCategory::optimizer: return "optimizer";
    case TimeCategory::conversions: return "conversions";
    case TimeCategory::elementwise: return "elementwise";
    case TimeCategory::allocation: return "allocation";
  }
  return "unknown";
}

double TimeBreakdown::total_seconds() const {
  return std::accumulate(seconds.begin(), seconds.end(), 0.0);
}

TimeBreakdown* installed_time_breakdown() noexcept { return installed; }

TimeBreakdownScope::TimeBreakdownScope(TimeBreakdown& sink) noexcept : previous_(installed) {
  installed = &sink;
}

TimeBreakdownScope::~TimeBreakdownScope() { installed = previous_; }

TimeAttributionScope::TimeAttributionScope(TimeCategory category) noexcept
    : sink_(installed) {
  if (sink_ == nullptr) return;
  previous_attributing_ = sink_->attributing;
  previous_category_ = sink_->attributed_to;
  sink_->attributing = true;
  sink_->attributed_to = category;
}

TimeAttributionScope::~TimeAttributionScope() {
  if (sink_ == nullptr) return;
  sink_->attributing = previous_attributing_;
  sink_->attributed_to = previous_category_;
}

void TimedSection::open(TimeCategory category) noexcept {
  outermost_ = sink_->open_sections++ == 0;
  if (!outermost_) return;
  category_ = sink_->attributing && category != TimeCategory::allocation ? sink_->attributed_to
                                                                          : category;
  start_ = std::chrono::steady_clock::now();
}

void TimedSection::close() noexcept {
  --sink_->open_sections;
  if (!outermost_) return;
  const auto index = static_cast<std::size_t>(category_);
  sink_->seconds[index] +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  ++sink_->calls[index];
}

}  // namespace oases
