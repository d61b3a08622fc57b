// Where a piece of work's time goes, by kind of kernel: a caller-owned sink of seconds and call
// counts per category, filled by the kernels' front door (kernels/kernels.cc) and by buffer
// allocation (core/buffer.cc) while a scope installs it for the calling thread.
//
//   TimeBreakdown times;
//   {
//     const TimeBreakdownScope scope(times);
//     engine.train_step(...);                    // kernels called on this thread add to `times`
//   }                                            // nothing is added after this point
//   times.seconds_of(TimeCategory::products) ...
//
// Why a thread-local pointer. The kernels are free functions reached from deep inside ops,
// models and optimizers; threading a sink through every signature would touch all of them and
// every caller. The project otherwise keeps no global mutable state, so this is the one
// narrow exception, and it stores nothing beyond a scope: a TimeBreakdownScope sets the
// pointer for its thread and restores the previous value when it ends; the sink itself is the
// caller's object. With no scope open, a timed section costs one thread-local load and a
// pointer test: normal runs are not slowed.
//
// What is counted. Only work done on the thread that opened the scope (the training step's
// compute runs on it; the threads inside a kernel — OpenMP, BLAS — are part of that kernel's
// time; a communicator's progress thread is not counted). A timed section opened inside another
// one (a front-door kernel that calls another) is counted by the outer one only, so nothing is
// counted twice. Allocation is the time spent creating and releasing Buffers (heap or anonymous
// mappings); the page faults of a mapping's first touch land in the kernel that touches it.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace oases {

enum class TimeCategory : std::uint8_t {
  products,     // linear layers' matrix products (forward and backward)
  attention,    // the attention core (scores, softmax, weighted values; and backward)
  norms,        // layernorm, rmsnorm
  head,         // the vocabulary projection and the cross-entropy
  optimizer,    // parameter updates, gradient norms and scaling (clipping)
  conversions,  // dtype conversions (f32 <-> bf16/f16, fp8 encodings)
  elementwise,  // everything else: gelu, swiglu, rotary, dropout, adds, embeddings, copies
  allocation,   // creating and releasing Buffers
};
inline constexpr int kTimeCategories = 8;

// "products", "attention", ... as above.
std::string_view time_category_name(TimeCategory category);

// Seconds and calls per category, summed over every timed section that ended while a
// TimeBreakdownScope of this sink was open on the section's thread.
struct TimeBreakdown {
  std::array<double, kTimeCategories> seconds{};
  std::array<std::int64_t, kTimeCategories> calls{};

  // The state of the sections open on the installing thread (TimedSection and
  // TimeAttributionScope keep it; callers leave it alone).
  int open_sections = 0;
  bool attributing = false;
  TimeCategory attributed_to = TimeCategory::elementwise;

  double seconds_of(TimeCategory c) const { return seconds[static_cast<int>(c)]; }
  std::int64_t calls_of(TimeCategory c) const { return calls[static_cast<int>(c)]; }
  double total_seconds() const;
};

// The sink installed on this thread, or null when none is.
TimeBreakdown* installed_time_breakdown() noexcept;

// Installs `sink` for the calling thread for the scope's lifetime (nests: the previous sink,
// if any, is restored at the end and receives nothing meanwhile).
class TimeBreakdownScope {
 public:
  explicit TimeBreakdownScope(TimeBreakdown& sink) noexcept;
  ~TimeBreakdownScope();
  TimeBreakdownScope(const TimeBreakdownScope&) = delete;
  TimeBreakdownScope& operator=(const TimeBreakdownScope&) = delete;

 private:
  TimeBreakdown* previous_;
};

// While open, the timed sections of this thread (other than allocation) are counted in
// `category` whatever their own: a model op names the purpose of the kernels it calls (the
// head's vocabulary projection is a matrix product, but counts as head). Does nothing when no
// sink is installed; restores the previous attribution at the end.
class TimeAttributionScope {
 public:
  explicit TimeAttributionScope(TimeCategory category) noexcept;
  ~TimeAttributionScope();
  TimeAttributionScope(const TimeAttributionScope&) = delete;
  TimeAttributionScope& operator=(const TimeAttributionScope&) = delete;

 private:
  TimeBreakdown* sink_;
  bool previous_attributing_ = false;
  TimeCategory previous_category_ = TimeCategory::elementwise;
};

// Times its own lifetime into the installed sink's `category` (or the attributed one): one
// call. Nothing when no sink is installed or when another section is already open on this
// thread (the outer one counts the time).
class TimedSection {
 public:
  explicit TimedSection(TimeCategory category) noexcept : sink_(installed_time_breakdown()) {
    if (sink_ != nullptr) open(category);
  }
  ~TimedSection() {
    if (sink_ != nullptr) close();
  }
  TimedSection(const TimedSection&) = delete;
  TimedSection& operator=(const TimedSection&) = delete;

 private:
  void open(TimeCategory category) noexcept;
  void close() noexcept;

  TimeBreakdown* sink_;
  bool outermost_ = false;
  TimeCategory category_ = TimeCategory::elementwise;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace oases
