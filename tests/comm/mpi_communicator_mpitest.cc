// MpiCommunicator under mpirun at 1 to 4 ranks: every operation, dtype and size (including 0
// and chunked sizes) on every group kind of every mesh layout; issue order; two groups in
// flight; overlap with compute; the timeout report. Values are small integers, so every
// dtype holds every expected result exactly (bf16 up to 256: reductions stay below; the tags that
// name an element's origin go to 2047, which f16 holds exactly and bf16 rounds alike on both
// sides of a comparison, so f16 is the 16-bit check of where elements land).
#include "comm/mesh.h"
#include "comm/mpi_communicator.h"
#include "kernels/cpu/convert.h"
#include "mpi_test_support.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace oases {

// A 16-bit floating-point element of the tests: its bit pattern, made from and compared as
// the value it holds.
template <DType kFormat>
struct Half {
  std::uint16_t bits = 0;
  Half() = default;
  explicit Half(double value)
      : bits(kFormat == DType::bf16 ? kernels::cpu::double_to_bf16_bits(value)
                                    : kernels::cpu::double_to_f16_bits(value)) {}
  double value() const {
    return kFormat == DType::bf16 ? kernels::cpu::bf16_bits_to_float(bits)
                                  : kernels::cpu::f16_bits_to_float(bits);
  }
  bool operator!=(const Half& other) const { return bits != other.bits; }
  friend std::ostream& operator<<(std::ostream& out, const Half& h) { return out << h.value(); }
};
template <DType kFormat>
struct dtype_of<Half<kFormat>> {
  static constexpr DType value = kFormat;
};

namespace comm {
namespace {

using mpitest::runtime;
using mpitest::test_options;

// Contribution of rank r at index i for reductions: alternately positive and negative, and
// growing with the rank, so sum, max and min all differ.
std::int64_t base(std::int64_t i) { return i % 2 == 0 ? i % 13 + 1 : -(i % 7 + 1); }
std::int64_t contribution(int rank, std::int64_t i) { return base(i) * (rank + 1); }
std::int64_t reduced(ReduceOp op, int size, std::int64_t i) {
  const std::int64_t b = base(i);
  switch (op) {
    case ReduceOp::sum: return b * size * (size + 1) / 2;
    case ReduceOp::max: return b > 0 ? b * size : b;
    case ReduceOp::min: return b > 0 ? b : b * size;
  }
  return 0;
}
const char* op_name(ReduceOp op) {
  return op == ReduceOp::sum ? "sum" : op == ReduceOp::max ? "max" : "min";
}

// A value that names its origin: rank, a chunk of the buffer, an index.
std::int64_t tagged(std::int64_t origin, std::int64_t i) { return origin * 128 + i % 128; }

template <class T>
Tensor view(std::vector<T>& v) {
  return Tensor::of(v.data(), {static_cast<std::int64_t>(v.size())});
}

template <class T, class Expected>
::testing::AssertionResult all_equal(const std::vector<T>& got, Expected expected) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto want = static_cast<T>(expected(static_cast<std::int64_t>(i)));
    if (got[i] != want) {
      return ::testing::AssertionFailure() << "element " << i << " of " << got.size() << ": got "
                                           << got[i] << ", expected " << want;
    }
  }
  return ::testing::AssertionSuccess();
}

// Runs `body.template operator()<T>()` for every dtype the MPI backend moves.
template <class Body>
void for_each_dtype(Body&& body) {
  body.template operator()<float>();
  body.template operator()<double>();
  body.template operator()<std::int32_t>();
  body.template operator()<std::int64_t>();
  body.template operator()<Half<DType::bf16>>();
  body.template operator()<Half<DType::f16>>();
}

template <class T>
void check_all_reduce(Communicator& c, std::int64_t n) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    std::vector<T> buffer(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) buffer[i] = static_cast<T>(contribution(c.rank(), i));
    c.all_reduce(view(buffer), op);
    EXPECT_TRUE(all_equal(buffer, [&](std::int64_t i) { return reduced(op, c.size(), i); }))
        << "all_reduce " << op_name(op);
  }
}

template <class T>
void check_all_gather(Communicator& c, std::int64_t n) {
  const auto s = static_cast<std::size_t>(c.size());
  const auto un = static_cast<std::size_t>(n);
  auto expected = [&](std::int64_t j) {
    return tagged(j / std::max<std::int64_t>(n, 1), j % std::max<std::int64_t>(n, 1));
  };
  std::vector<T> input(un), output(s * un, T(-1));
  for (std::int64_t i = 0; i < n; ++i) input[i] = static_cast<T>(tagged(c.rank(), i));
  c.all_gather(view(input), view(output));
  EXPECT_TRUE(all_equal(output, expected)) << "all_gather";

  // In place: the input is this rank's block of the output.
  std::vector<T> in_place(s * un, T(-1));
  for (std::int64_t i = 0; i < n; ++i)
    in_place[c.rank() * un + i] = static_cast<T>(tagged(c.rank(), i));
  c.all_gather(Tensor::of(in_place.data() + c.rank() * un, {n}), view(in_place));
  EXPECT_TRUE(all_equal(in_place, expected)) << "all_gather in place";
}

template <class T>
void check_reduce_scatter(Communicator& c, std::int64_t n) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
    std::vector<T> input(static_cast<std::size_t>(n * c.size()));
    std::vector<T> output(static_cast<std::size_t>(n), T(-1));
    for (std::size_t j = 0; j < input.size(); ++j) {
      input[j] = static_cast<T>(contribution(c.rank(), static_cast<std::int64_t>(j)));
    }
    c.reduce_scatter(view(input), view(output), op);
    EXPECT_TRUE(
        all_equal(output, [&](std::int64_t i) { return reduced(op, c.size(), c.rank() * n + i); }))
        << "reduce_scatter " << op_name(op);
  }
}

template <class T>
void check_broadcast(Communicator& c, std::int64_t n, bool every_root) {
  for (int root = every_root ? 0 : c.size() - 1; root < c.size(); ++root) {
    std::vector<T> buffer(static_cast<std::size_t>(n), T(-1));
    if (c.rank() == root) {
      for (std::int64_t i = 0; i < n; ++i) buffer[i] = static_cast<T>(tagged(root, i));
    }
    c.broadcast(view(buffer), root);
    EXPECT_TRUE(all_equal(buffer, [&](std::int64_t i) { return tagged(root, i); }))
        << "broadcast from " << root;
  }
}

template <class T>
void check_send_recv_ring(Communicator& c, std::int64_t n) {
  const int next = (c.rank() + 1) % c.size();
  const int previous = (c.rank() + c.size() - 1) % c.size();
  std::vector<T> out(static_cast<std::size_t>(n)), in(static_cast<std::size_t>(n), T(-1));
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(tagged(c.rank(), i));
  // Both in flight at once, as every rank sends before it receives.
  auto sent = c.send_async(view(out), next, 5);
  auto received = c.recv_async(view(in), previous, 5);
  received->wait();
  sent->wait();
  EXPECT_TRUE(all_equal(in, [&](std::int64_t i) { return tagged(previous, i); })) << "send/recv";
}

// A ring step each way (and two places on): every rank gets the block of the rank `offset`
// places before it.
template <class T>
void check_shift(Communicator& c, std::int64_t n) {
  const int s = c.size();
  for (const int offset : {1, -1, 2}) {
    std::vector<T> out(static_cast<std::size_t>(n)), in(static_cast<std::size_t>(n), T(-1));
    for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(tagged(c.rank(), i));
    c.shift_async(view(out), view(in), offset)->wait();
    const int from = ((c.rank() - offset) % s + s) % s;
    EXPECT_TRUE(all_equal(in, [&](std::int64_t i) { return tagged(from, i); }))
        << "shift by " << offset;
  }
}

template <class T>
void check_all_to_all(Communicator& c, std::int64_t n) {
  const int s = c.size();
  std::vector<T> input(static_cast<std::size_t>(n * s)), output(input.size(), T(-1));
  for (int j = 0; j < s; ++j) {
    for (std::int64_t k = 0; k < n; ++k)
      input[j * n + k] = static_cast<T>(tagged(c.rank() * s + j, k));
  }
  c.all_to_all(view(input), view(output));
  EXPECT_TRUE(all_equal(output, [&](std::int64_t x) {
    return tagged(x / n * s + c.rank(), x % n);
  })) << "all_to_all";
}

template <class T>
void check_all_to_allv(Communicator& c, std::int64_t n) {
  const int s = c.size();
  // Elements rank a sends to rank b: about n / 4, different for every pair, sometimes 0.
  auto count = [&](int a, int b) -> std::int64_t {
    return n == 0 ? 0 : n / 4 + (3 * a + b + n) % 5;
  };
  std::vector<std::int64_t> send_counts(s), recv_counts(s);
  std::int64_t sent = 0, received = 0;
  for (int j = 0; j < s; ++j) {
    send_counts[j] = count(c.rank(), j);
    recv_counts[j] = count(j, c.rank());
    sent += send_counts[j];
    received += recv_counts[j];
  }
  // Three spare elements at the end of each buffer: never sent, never written.
  std::vector<T> input(static_cast<std::size_t>(sent + 3), T(-5));
  std::vector<T> output(static_cast<std::size_t>(received + 3), T(-7));
  std::vector<std::int64_t> expected(output.size(), -7);
  for (int j = 0, offset = 0; j < s; offset += static_cast<int>(send_counts[j]), ++j) {
    for (std::int64_t k = 0; k < send_counts[j]; ++k)
      input[offset + k] = static_cast<T>(tagged(c.rank() * s + j, k));
  }
  for (int i = 0, offset = 0; i < s; offset += static_cast<int>(recv_counts[i]), ++i) {
    for (std::int64_t k = 0; k < recv_counts[i]; ++k)
      expected[offset + k] = tagged(i * s + c.rank(), k);
  }
  c.all_to_allv_async(view(input), send_counts, view(output), recv_counts)->wait();
  EXPECT_TRUE(all_equal(output, [&](std::int64_t x) { return expected[x]; })) << "all_to_allv";
}

template <class T>
void check_every_operation(Communicator& c, std::int64_t n, bool every_root) {
  SCOPED_TRACE(::testing::Message()
               << "group '" << c.name() << "' (rank " << c.rank() << " of " << c.size() << "), "
               << n << " " << dtype_name(dtype_of<T>::value));
  check_all_reduce<T>(c, n);
  check_all_gather<T>(c, n);
  check_reduce_scatter<T>(c, n);
  check_broadcast<T>(c, n, every_root);
  check_send_recv_ring<T>(c, n);
  check_shift<T>(c, n);
  check_all_to_all<T>(c, n);
  check_all_to_allv<T>(c, n);
  c.barrier();
}

std::vector<Communicator*> groups_of(Mesh& mesh) {
  return {&mesh.world(), &mesh.tp_group(), &mesh.dp_group(), &mesh.pp_group()};
}

// The layout whose groups are the most varied: (2, 2, 1) at 4 ranks, (2, 1, 1) at 2.
std::array<int, 3> varied_layout(int world_size) {
  if (world_size % 4 == 0) return {2, 2, world_size / 4};
  if (world_size % 2 == 0) return {2, world_size / 2, 1};
  return {world_size, 1, 1};
}

TEST(MpiCommunicator, EveryOperationSmallSizesEveryDtypeEveryGroupOfEveryLayout) {
  for (const auto& [tp, dp, pp] : mpitest::layouts(runtime().world_size())) {
    SCOPED_TRACE(::testing::Message() << "tp=" << tp << " dp=" << dp << " pp=" << pp);
    Mesh mesh = Mesh::create(runtime(), tp, dp, pp, test_options());
    for (Communicator* group : groups_of(mesh)) {
      for (std::int64_t n : {0, 1, 7, 1001}) {
        for_each_dtype(
            [&]<class T>() { check_every_operation<T>(*group, n, /*every_root=*/true); });
      }
    }
  }
}

TEST(MpiCommunicator, EveryOperationLargeSizeEveryGroup) {
  // Large enough for every protocol switch (eager to rendezvous, segmented algorithms);
  // dtypes only change the element size, so f64 and i32 stop at the world group.
  constexpr std::int64_t kLarge = 2'000'001;
  const auto [tp, dp, pp] = varied_layout(runtime().world_size());
  Mesh mesh = Mesh::create(runtime(), tp, dp, pp, test_options());
  for_each_dtype([&]<class T>() { check_every_operation<T>(mesh.world(), kLarge, false); });
  for (Communicator* group : {&mesh.tp_group(), &mesh.dp_group(), &mesh.pp_group()}) {
    check_every_operation<float>(*group, kLarge, false);
  }
}

// 16-bit sums are rounded once per combination: over two ranks the result is the correctly
// rounded sum; over p ranks each of the p - 1 combinations rounds a partial sum no larger than
// the sum of magnitudes, so |result - exact| <= (p - 1) u sum |a_r| with u = 2^-8 (bf16) or
// 2^-11 (f16), half a unit in the last place relative.
template <DType kFormat>
void check_16bit_rounding(Communicator& c) {
  const double u = kFormat == DType::bf16 ? 0x1p-8 : 0x1p-11;
  constexpr std::int64_t n = 4096;
  auto addend = [&](int rank, std::int64_t i) {
    // Values of mixed magnitude whose sums need rounding: 1 + rank * k * u / 3 and the like.
    return Half<kFormat>((i % 2 == 0 ? 1.0 : -0.75) * (1 + static_cast<double>((rank + 1) * (i % 97)) * u / 3) *
                         std::ldexp(1.0, static_cast<int>(i % 5) - 2))
        .value();
  };
  std::vector<Half<kFormat>> buffer(n);
  for (std::int64_t i = 0; i < n; ++i) buffer[i] = Half<kFormat>(addend(c.rank(), i));
  c.all_reduce(view(buffer), ReduceOp::sum);
  for (std::int64_t i = 0; i < n; ++i) {
    double exact = 0, magnitude = 0;
    for (int r = 0; r < c.size(); ++r) {
      exact += addend(r, i);  // exact in double: a few 16-bit values of nearby exponents
      magnitude += std::fabs(addend(r, i));
    }
    if (c.size() <= 2) {
      ASSERT_EQ(buffer[i].bits, Half<kFormat>(exact).bits) << "element " << i;
    } else {
      ASSERT_LE(std::fabs(buffer[i].value() - exact), (c.size() - 1) * u * magnitude)
          << "element " << i;
    }
  }
}

TEST(MpiCommunicator, SixteenBitSumsRoundOncePerCombination) {
  MpiCommunicator c(MPI_COMM_WORLD, "16-bit", test_options());
  check_16bit_rounding<DType::bf16>(c);
  check_16bit_rounding<DType::f16>(c);
}

// Small per-call limits force every chunked path (contiguous pieces, strided blocks, one
// reduction per block) on buffers that stay small.
TEST(MpiCommunicator, ChunkedOperationsMatchUnchunkedResults) {
  const auto [tp, dp, pp] = varied_layout(runtime().world_size());
  for (std::int64_t limit : {1000, 7}) {
    SCOPED_TRACE(::testing::Message() << "max_elements_per_call = " << limit);
    MpiCommunicatorOptions options = test_options();
    options.max_elements_per_call = limit;
    Mesh mesh = Mesh::create(runtime(), tp, dp, pp, options);
    const std::vector<std::int64_t> sizes = limit == 7
                                                ? std::vector<std::int64_t>{0, 1, 6, 7, 8, 50}
                                                : std::vector<std::int64_t>{999, 1000, 1001, 4321};
    for (Communicator* group : groups_of(mesh)) {
      for (std::int64_t n : sizes) {
        check_every_operation<float>(*group, n, false);
        check_every_operation<std::int64_t>(*group, n, false);
      }
    }
  }
}

// A bound on the bytes of each call (parallel.bucket_bytes) cuts operations by their dtype's
// size and, for block operations, their number of blocks; results are the same.
TEST(MpiCommunicator, OperationsBoundedInBytesPerCallMatchUnboundedResults) {
  const auto [tp, dp, pp] = varied_layout(runtime().world_size());
  for (std::int64_t bytes : {64, 1}) {
    SCOPED_TRACE(::testing::Message() << "max_bytes_per_call = " << bytes);
    MpiCommunicatorOptions options = test_options();
    options.max_bytes_per_call = bytes;
    Mesh mesh = Mesh::create(runtime(), tp, dp, pp, options);
    for (Communicator* group : groups_of(mesh)) {
      for (std::int64_t n : {0, 1, 15, 16, 17, 100}) {
        check_every_operation<float>(*group, n, false);
        check_every_operation<std::int64_t>(*group, n, false);
      }
    }
  }
}

// reduce_scatter_blocks and all_gather_blocks over blocks of unequal sizes (empty ones too),
// whole and in chunks, against the same result formed here from every rank's contribution;
// and the base class's versions (SelfCommunicator: a group of one) leave a lone block as it is.
TEST(MpiCommunicator, BlockCollectivesOwnAndGatherUnequalBlocks) {
  for (std::int64_t limit : {std::int64_t{1} << 20, std::int64_t{3}, std::int64_t{-24}}) {
    // A negative limit: at most -limit bytes per call instead.
    SCOPED_TRACE(::testing::Message() << "max_elements_per_call = " << limit);
    MpiCommunicatorOptions options = test_options();
    if (limit > 0) options.max_elements_per_call = limit;
    else options.max_bytes_per_call = -limit;
    MpiCommunicator c(MPI_COMM_WORLD, "blocks", options);
    const int n = c.size(), me = c.rank();
    for (const std::int64_t shift : {0, 1, 5}) {
      // Block r holds (r * 3 + shift) % 7 elements: some empty, none equal to the next.
      std::vector<std::int64_t> counts;
      std::int64_t total = 0, mine = 0;
      for (int r = 0; r < n; ++r) {
        counts.push_back((r * 3 + shift) % 7);
        if (r == me) mine = total;
        total += counts.back();
      }
      std::vector<double> buffer(static_cast<std::size_t>(total));
      for (std::int64_t i = 0; i < total; ++i)
        buffer[static_cast<std::size_t>(i)] = static_cast<double>(contribution(me, i));
      const std::vector<double> before = buffer;
      c.reduce_scatter_blocks_async(Tensor::of(buffer.data(), {total}), counts, ReduceOp::sum)
          ->wait();
      for (std::int64_t i = mine; i < mine + counts[static_cast<std::size_t>(me)]; ++i)
        EXPECT_EQ(buffer[static_cast<std::size_t>(i)],
                  static_cast<double>(reduced(ReduceOp::sum, n, i)))
            << "element " << i;
      // Every block gets its owner's values; mark them with the owner's rank.
      std::int64_t at = 0;
      for (int r = 0; r < n; ++r) {
        for (std::int64_t i = at; i < at + counts[static_cast<std::size_t>(r)]; ++i)
          buffer[static_cast<std::size_t>(i)] =
              r == me ? before[static_cast<std::size_t>(i)] + 1000.0 * r : -1.0;
        at += counts[static_cast<std::size_t>(r)];
      }
      c.all_gather_blocks_async(Tensor::of(buffer.data(), {total}), counts)->wait();
      at = 0;
      for (int r = 0; r < n; ++r) {
        for (std::int64_t i = at; i < at + counts[static_cast<std::size_t>(r)]; ++i)
          EXPECT_EQ(buffer[static_cast<std::size_t>(i)],
                    static_cast<double>(contribution(r, i)) + 1000.0 * r)
              << "element " << i << " of rank " << r << "'s block";
        at += counts[static_cast<std::size_t>(r)];
      }
    }
  }
  SelfCommunicator self;
  std::vector<float> lone{1, 2, 3};
  self.reduce_scatter_blocks_async(Tensor::of(lone.data(), {3}), {3}, ReduceOp::sum)->wait();
  self.all_gather_blocks_async(Tensor::of(lone.data(), {3}), {3})->wait();
  EXPECT_EQ(lone, (std::vector<float>{1, 2, 3}));
}

TEST(MpiCommunicator, ManyAsyncOperationsCompleteInIssueOrder) {
  MpiCommunicator c(MPI_COMM_WORLD, "order", test_options());
  constexpr int kOps = 60;
  std::vector<std::vector<float>> buffers(kOps);
  std::vector<std::unique_ptr<Work>> works;
  auto size_of = [](int k) -> std::int64_t { return k % 4 == 0 ? 200'000 : 1 + 37 * k; };
  for (int k = 0; k < kOps; ++k) {
    auto& b = buffers[k];
    b.resize(static_cast<std::size_t>(size_of(k)));
    if (k % 3 == 1) {
      const int root = k % c.size();
      for (std::size_t i = 0; i < b.size(); ++i)
        b[i] = c.rank() == root ? float(tagged(k, std::int64_t(i))) : -1.0f;
      works.push_back(c.broadcast_async(view(b), root));
    } else {
      for (std::size_t i = 0; i < b.size(); ++i)
        b[i] = float(contribution(c.rank(), std::int64_t(i) + k));
      works.push_back(c.all_reduce_async(view(b), k % 3 == 0 ? ReduceOp::sum : ReduceOp::max));
    }
  }
  works[kOps / 2]->wait();
  for (int k = 0; k <= kOps / 2; ++k) EXPECT_TRUE(works[k]->test()) << "operation " << k;
  for (auto& w : works) w->wait();
  for (int k = 0; k < kOps; ++k) {
    if (k % 3 == 1) {
      EXPECT_TRUE(all_equal(buffers[k], [&](std::int64_t i) { return tagged(k, i); })) << k;
    } else {
      const ReduceOp op = k % 3 == 0 ? ReduceOp::sum : ReduceOp::max;
      EXPECT_TRUE(all_equal(buffers[k], [&](std::int64_t i) {
        return reduced(op, c.size(), i + k);
      })) << k;
    }
  }
}

TEST(MpiCommunicator, TwoGroupsInFlightAtOnce) {
  const auto [tp, dp, pp] = varied_layout(runtime().world_size());
  Mesh mesh = Mesh::create(runtime(), tp, dp, pp, test_options());
  Communicator& tp_group = mesh.tp_group();
  Communicator& dp_group = mesh.dp_group();
  constexpr int kRounds = 12;
  std::vector<std::vector<std::int64_t>> tp_buffers(kRounds), dp_buffers(kRounds);
  std::vector<std::unique_ptr<Work>> tp_works, dp_works;
  for (int k = 0; k < kRounds; ++k) {
    // dp carries a large operation while tp runs small ones, and the other way round.
    const std::size_t tp_n = k % 2 ? 500'000 : 300, dp_n = k % 2 ? 300 : 500'000;
    tp_buffers[k].resize(tp_n);
    dp_buffers[k].resize(dp_n);
    for (std::size_t i = 0; i < tp_n; ++i)
      tp_buffers[k][i] = contribution(tp_group.rank(), std::int64_t(i) + k);
    for (std::size_t i = 0; i < dp_n; ++i)
      dp_buffers[k][i] = contribution(dp_group.rank(), std::int64_t(i) + k);
    tp_works.push_back(tp_group.all_reduce_async(view(tp_buffers[k]), ReduceOp::sum));
    dp_works.push_back(dp_group.all_reduce_async(view(dp_buffers[k]), ReduceOp::min));
  }
  for (int k = kRounds - 1; k >= 0; --k) {
    dp_works[k]->wait();
    tp_works[k]->wait();
  }
  for (int k = 0; k < kRounds; ++k) {
    EXPECT_TRUE(
        all_equal(tp_buffers[k],
                  [&](std::int64_t i) { return reduced(ReduceOp::sum, tp_group.size(), i + k); }))
        << "tp " << k;
    EXPECT_TRUE(
        all_equal(dp_buffers[k],
                  [&](std::int64_t i) { return reduced(ReduceOp::min, dp_group.size(), i + k); }))
        << "dp " << k;
  }
}

// With a strict one-at-a-time queue, a large send issued before a collective and its recv
// issued after would deadlock: the send waits for a recv that sits behind the collective.
TEST(MpiCommunicator, PointToPointDoesNotHoldUpTheQueue) {
  MpiCommunicator c(MPI_COMM_WORLD, "p2p", test_options());
  const int next = (c.rank() + 1) % c.size();
  const int previous = (c.rank() + c.size() - 1) % c.size();
  constexpr std::int64_t kLarge = 1'000'000;  // far above any eager limit
  std::vector<double> out(kLarge), in(kLarge, -1);
  for (std::int64_t i = 0; i < kLarge; ++i) out[i] = double(tagged(c.rank(), i));
  std::vector<std::int32_t> small(5);
  for (std::int64_t i = 0; i < 5; ++i) small[i] = std::int32_t(contribution(c.rank(), i));
  auto sent = c.send_async(view(out), next, 1);
  auto reduced_small = c.all_reduce_async(view(small), ReduceOp::sum);
  auto received = c.recv_async(view(in), previous, 1);
  received->wait();
  EXPECT_TRUE(sent->test());
  EXPECT_TRUE(reduced_small->test());
  EXPECT_TRUE(all_equal(in, [&](std::int64_t i) { return tagged(previous, i); }));
  EXPECT_TRUE(
      all_equal(small, [&](std::int64_t i) { return reduced(ReduceOp::sum, c.size(), i); }));
}

TEST(MpiCommunicator, DestructionWaitsForOutstandingOperations) {
  std::vector<float> buffer(100'000);
  for (std::size_t i = 0; i < buffer.size(); ++i)
    buffer[i] = float(contribution(runtime().world_rank(), std::int64_t(i)));
  std::unique_ptr<Work> work;
  {
    MpiCommunicator c(MPI_COMM_WORLD, "short-lived", test_options());
    work = c.all_reduce_async(view(buffer), ReduceOp::max);
  }
  EXPECT_TRUE(work->test());
  work->wait();
  EXPECT_TRUE(all_equal(
      buffer, [&](std::int64_t i) { return reduced(ReduceOp::max, runtime().world_size(), i); }));
}

double busy_compute(std::int64_t iterations) {
  double x = 1.0, y = 0.5;
  for (std::int64_t i = 0; i < iterations; ++i) {
    x = x * 0.9999999 + y;
    y = y * 0.9999998 + 1e-9 * x;
  }
  return x + y;
}

double seconds_of(auto&& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The progress thread must leave the compute thread its core. Timings are printed, not
// asserted: the machine running the tests may be loaded.
TEST(MpiCommunicator, CollectiveInFlightWhileComputing) {
  MpiCommunicator c(MPI_COMM_WORLD, "overlap", test_options());
  constexpr std::int64_t kIterations = 40'000'000;
  constexpr std::int64_t kElements = 4'000'000;
  std::vector<float> buffer(kElements);
  auto fill = [&] {
    for (std::int64_t i = 0; i < kElements; ++i) buffer[i] = float(contribution(c.rank(), i));
  };
  double sink = 0;
  fill();
  c.barrier();
  const double comm_alone = seconds_of([&] { c.all_reduce(view(buffer)); });
  c.barrier();
  const double compute_alone = seconds_of([&] { sink += busy_compute(kIterations); });
  fill();
  c.barrier();
  std::unique_ptr<Work> work;
  double waited = 0;
  const double overlapped = seconds_of([&] {
    work = c.all_reduce_async(view(buffer), ReduceOp::sum);
    sink += busy_compute(kIterations);
  });
  waited = seconds_of([&] {
    while (!work->test()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  });
  work->wait();
  EXPECT_TRUE(
      all_equal(buffer, [&](std::int64_t i) { return reduced(ReduceOp::sum, c.size(), i); }));
  EXPECT_GT(sink, 0);
  std::printf(
      "[rank %d] all_reduce of %lld f32 alone %.3f s; compute alone %.3f s, with the "
      "all_reduce in flight %.3f s (x%.2f), then waited %.3f s\n",
      runtime().world_rank(), static_cast<long long>(kElements), comm_alone, compute_alone,
      overlapped, overlapped / compute_alone, waited);
}

// Records timeout reports from the progress thread.
struct TimeoutLog {
  std::mutex mutex;
  std::vector<std::string> messages;
  void add(const std::string& m) {
    std::lock_guard lock(mutex);
    messages.push_back(m);
  }
  std::vector<std::string> snapshot() {
    std::lock_guard lock(mutex);
    return messages;
  }
  bool wait_for_one(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (!snapshot().empty()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
};

MpiCommunicatorOptions recording_options(TimeoutLog& log, double seconds) {
  MpiCommunicatorOptions options;
  options.timeout_seconds = seconds;
  options.on_timeout = [&log](const std::string& message) { log.add(message); };
  return options;
}

// Rank 0 starts an all_reduce that the others join only after rank 0 has seen the timeout
// report; then everyone completes it, so the run ends cleanly.
TEST(MpiCommunicator, TimeoutNamesTheLateOperation) {
  TimeoutLog log;
  MpiCommunicator late(MPI_COMM_WORLD, "late", recording_options(log, 0.2));
  MpiCommunicator sync(MPI_COMM_WORLD, "sync", test_options());
  std::vector<float> buffer(1001);
  for (std::int64_t i = 0; i < 1001; ++i) buffer[i] = float(contribution(late.rank(), i));
  if (late.rank() == 0 && late.size() > 1) {
    auto work = late.all_reduce_async(view(buffer), ReduceOp::sum);
    ASSERT_TRUE(log.wait_for_one(20)) << "no timeout report";
    EXPECT_FALSE(work->test());
    sync.barrier();
    work->wait();
    const auto messages = log.snapshot();
    ASSERT_EQ(messages.size(), 1u);
    EXPECT_EQ(messages[0], fmt::format("oases: all_reduce of 1001 f32 on group 'late' (size {}) "
                                       "has not completed after 0.2 s on rank 0 (world rank 0); "
                                       "a peer is missing or stuck",
                                       late.size()));
  } else {
    sync.barrier();
    late.all_reduce(view(buffer), ReduceOp::sum);
  }
  EXPECT_TRUE(
      all_equal(buffer, [&](std::int64_t i) { return reduced(ReduceOp::sum, late.size(), i); }));
}

// Every rank's recv waits for a send its neighbour issues only after the report: the message
// names the peer and tag, and the recv then completes.
TEST(MpiCommunicator, TimeoutOfARecvNamesPeerAndTag) {
  TimeoutLog log;
  MpiCommunicator late(MPI_COMM_WORLD, "pp", recording_options(log, 0.1));
  MpiCommunicator sync(MPI_COMM_WORLD, "sync", test_options());
  const int next = (late.rank() + 1) % late.size();
  const int previous = (late.rank() + late.size() - 1) % late.size();
  std::vector<std::int64_t> in(7, -1), out(7, late.rank());
  auto received = late.recv_async(view(in), previous, 9);
  ASSERT_TRUE(log.wait_for_one(20)) << "no timeout report";
  sync.barrier();
  late.send(view(out), next, 9);
  received->wait();
  EXPECT_TRUE(all_equal(in, [&](std::int64_t) { return previous; }));
  const auto messages = log.snapshot();
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0],
            fmt::format("oases: recv of 7 i64 from rank {} (tag 9) on group 'pp' (size {}) has not "
                        "completed after 0.1 s on rank {} (world rank {}); a peer is missing or "
                        "stuck",
                        previous, late.size(), late.rank(), runtime().world_rank()));
}

// With a flight recorder, a timeout writes the record first: the late all_reduce is there,
// started and unfinished, numbered after the group's earlier collectives and labelled by its
// issuer, and the timeout's message says where the record is.
TEST(MpiCommunicator, ATimeoutWritesTheFlightRecord) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    fmt::format("oases_flight_mpitest_{}", getppid()) / "flight";
  auto recorder = std::make_shared<FlightRecorder>(
      dir.string(), FlightIdentity{runtime().world_rank(), runtime().world_size(), "h", {}}, 16);
  TimeoutLog log;
  MpiCommunicatorOptions options = recording_options(log, 0.2);
  options.flight = recorder;
  MpiCommunicator late(MPI_COMM_WORLD, "late", options);
  MpiCommunicator sync(MPI_COMM_WORLD, "sync", test_options());
  std::vector<double> buffer(9, 1.0);
  late.set_issuer("first");
  late.all_reduce(view(buffer), ReduceOp::sum);
  late.set_issuer({});
  late.barrier();
  if (late.rank() == 0 && late.size() > 1) {
    std::unique_ptr<Work> work;
    {
      const IssuerLabel label(late, "F(attention.5, mb=1, sb=0)");
      work = late.all_reduce_async(view(buffer), ReduceOp::sum);
    }
    ASSERT_TRUE(log.wait_for_one(20)) << "no timeout report";
    const auto messages = log.snapshot();
    EXPECT_NE(messages[0].find("flight record written to " + (dir / "rank_0.json").string()),
              std::string::npos) << messages[0];
    std::ifstream in(dir / "rank_0.json");
    const nlohmann::json record = nlohmann::json::parse(in);
    EXPECT_EQ(record["reason"].get<std::string>().rfind("collective timeout: oases: all_reduce", 0),
              0u) << record.dump();
    const auto& ring = record["groups"][0];
    EXPECT_EQ(ring["group"], "late");
    EXPECT_EQ(ring["collectives_issued"], 3);
    const auto& ops = ring["operations"];
    ASSERT_EQ(ops.size(), 3u);
    EXPECT_EQ(ops[0]["issuer"], "first");
    EXPECT_EQ(ops[0]["state"], "finished");
    EXPECT_EQ(ops[0]["bytes"], 72);
    EXPECT_EQ(ops[0]["dtype"], "f64");
    EXPECT_EQ(ops[1]["kind"], "barrier");
    EXPECT_EQ(ops[1]["issuer"], "");
    EXPECT_EQ(ops[2]["seq"], 3);
    EXPECT_EQ(ops[2]["issuer"], "F(attention.5, mb=1, sb=0)");
    EXPECT_EQ(ops[2]["state"], "started");
    EXPECT_GE(ops[2]["waited_s"].get<double>(), 0.2);
    sync.barrier();
    work->wait();
    std::filesystem::remove_all(dir.parent_path());
  } else {
    sync.barrier();
    late.all_reduce(view(buffer), ReduceOp::sum);
  }
}

TEST(MpiCommunicator, IssueTimeChecks) {
  MpiCommunicator c(MPI_COMM_WORLD, "checks", test_options());
  std::vector<float> a(6), b(5);
  EXPECT_THROW(c.all_gather_async(view(a), view(b)), InternalError);
  EXPECT_THROW(
      c.reduce_scatter_async(view(b), Tensor::of(a.data(), {6 * c.size() + 1}), ReduceOp::sum),
      InternalError);
  EXPECT_THROW(c.broadcast_async(view(a), c.size()), InternalError);
  EXPECT_THROW(c.send_async(view(a), -1, 0), InternalError);
  EXPECT_THROW(c.recv_async(view(a), 0, -3), InternalError);
  std::vector<std::uint8_t> bytes(4);  // no reduction of raw bytes
  EXPECT_THROW(c.all_reduce_async(Tensor::of(bytes.data(), {4}), ReduceOp::sum), InternalError);
  std::vector<double> d(6);
  EXPECT_THROW(c.all_to_all_async(view(a), view(d)), InternalError);
  // all_to_allv counts are never split: one above the int limit is a user-facing error.
  std::vector<std::int64_t> huge(static_cast<std::size_t>(c.size()), 0), zero = huge;
  huge[0] = std::int64_t{INT_MAX} + 1;
  try {
    c.all_to_allv_async(view(a), huge, view(b), zero);
    ADD_FAILURE() << "no throw";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the MPI limit"), std::string::npos) << e.what();
  }
  c.barrier();  // nothing above reached MPI: the queue is still in step on every rank
}

}  // namespace
}  // namespace comm
}  // namespace oases
