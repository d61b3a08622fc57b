#include "comm/mpi_communicator.h"

#include "core/error.h"
#include "kernels/kernels.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace oases::comm {
namespace {

using Clock = std::chrono::steady_clock;

// How the progress thread waits between MPI_Test calls. For kSpinWindow after progress (an
// operation started, a step completed) it tests back to back, yielding the core between
// tests: small collectives complete within tens of microseconds, and a single sleep costs
// about that much (timer granularity, more on virtual machines), which measured 300 us per
// 4-byte all_reduce against 10 us with the window. Past the window it sleeps, doubling from
// kFirstPause to kLongestPause, so a long collective costs one test every 100 us rather than
// a core the compute thread needs.
constexpr std::chrono::microseconds kSpinWindow{50};
constexpr std::chrono::microseconds kFirstPause{2};
constexpr std::chrono::microseconds kLongestPause{100};

enum class OpKind {
  all_reduce,
  all_gather,
  reduce_scatter,
  broadcast,
  send,
  recv,
  all_to_all,
  all_to_allv,
  reduce_scatter_blocks,
  all_gather_blocks,
  barrier
};

const char* kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::all_reduce: return "all_reduce";
    case OpKind::all_gather: return "all_gather";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::broadcast: return "broadcast";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::all_to_all: return "all_to_all";
    case OpKind::all_to_allv: return "all_to_allv";
    case OpKind::reduce_scatter_blocks: return "reduce_scatter_blocks";
    case OpKind::all_gather_blocks: return "all_gather_blocks";
    case OpKind::barrier: return "barrier";
  }
  return "?";
}

bool is_point_to_point(OpKind kind) { return kind == OpKind::send || kind == OpKind::recv; }

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    // MPI has no 16-bit floating-point types: the bits move as unsigned integers, and
    // reductions use the Engine's own operators (ReduceOps16).
    case DType::bf16: case DType::f16: return MPI_UINT16_T;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// Element-wise reductions of bf16 and f16 bit patterns for MPI_Op_create: kernels::reduce_into,
// which combines each pair exactly in double and rounds once to the format, so a reduction over
// two ranks is the correctly rounded sum; over more ranks each partial sum is rounded, in the
// order MPI's algorithm combines them.
constexpr kernels::Reduction kernel_reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return kernels::Reduction::sum;
    case ReduceOp::max: return kernels::Reduction::max;
    case ReduceOp::min: return kernels::Reduction::min;
  }
  return kernels::Reduction::sum;
}
template <DType kFormat, ReduceOp kOp>
void reduce_16bit(void* in, void* inout, int* length, MPI_Datatype*) {
  kernels::reduce_into(Tensor(in, kFormat, {*length}), Tensor(inout, kFormat, {*length}),
                       kernel_reduction(kOp));
}

// The MPI operators for 16-bit reductions, created by each Engine and freed with it (MPI
// operators are created after MPI_Init, so they cannot be constants).
class ReduceOps16 {
 public:
  ReduceOps16() {
    create<DType::bf16>(0);
    create<DType::f16>(3);
  }
  ~ReduceOps16() {
    for (MPI_Op& op : ops_) MPI_Op_free(&op);
  }
  ReduceOps16(const ReduceOps16&) = delete;
  ReduceOps16& operator=(const ReduceOps16&) = delete;

  MPI_Op get(DType format, ReduceOp op) const {
    return ops_[(format == DType::bf16 ? 0 : 3) + static_cast<int>(op)];
  }

 private:
  template <DType kFormat>
  void create(int first) {
    static_assert(static_cast<int>(ReduceOp::sum) == 0 && static_cast<int>(ReduceOp::max) == 1 &&
                  static_cast<int>(ReduceOp::min) == 2);
    MPI_Op_create(&reduce_16bit<kFormat, ReduceOp::sum>, 1, &ops_[first]);
    MPI_Op_create(&reduce_16bit<kFormat, ReduceOp::max>, 1, &ops_[first + 1]);
    MPI_Op_create(&reduce_16bit<kFormat, ReduceOp::min>, 1, &ops_[first + 2]);
  }
  std::array<MPI_Op, 6> ops_{};
};

char* byte_ptr(const Tensor& t) { return static_cast<char*>(t.raw()); }

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const char* a0 = byte_ptr(a);
  const char* b0 = byte_ptr(b);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// One issued operation, shared by the queue, the progress thread and its Work handle. The
// progress thread alone touches everything but `done` once the operation is queued.
struct Operation {
  OpKind kind = OpKind::barrier;
  Tensor input;  // the buffer of single-buffer operations
  Tensor output;
  ReduceOp reduce = ReduceOp::sum;
  int peer = 0;  // root of broadcast, peer of send and recv
  int tag = 0;
  bool in_place = false;      // all_gather whose input is this rank's block of output
  std::int64_t reported = 0;  // element count named in the timeout message

  // Chunking: `elements` (the whole buffer, or one rank block) in pieces of `chunk`.
  std::int64_t elements = 0;
  std::int64_t chunk = 0;
  std::int64_t num_chunks = 1;
  std::int64_t next_chunk = 0;

  std::vector<int> alltoallv_args;  // send counts, send offsets, recv counts, recv offsets
  // reduce_scatter_blocks, all_gather_blocks: the blocks' element counts; chunk c covers
  // elements [c * chunk, (c + 1) * chunk) of every block at once.
  std::vector<std::int64_t> block_counts;
  // reduce_scatter_blocks with equal blocks, exchanged point to point: the chunks of this
  // rank's block the others send ([size - 1][chunk]), reduced into the block (reduce_into,
  // reduce_count elements) once the step completes; the tag of the exchange, one per operation.
  std::vector<std::byte> staging;
  char* reduce_into = nullptr;
  int reduce_count = 0;
  int exchange_tag = -1;

  // State of the step in flight (one chunk of a collective, or every chunk of a send/recv).
  std::vector<MPI_Request> requests;
  std::vector<MPI_Datatype> step_types;  // freed once the step completes
  Clock::time_point started;   // admitted by the progress thread
  Clock::time_point finished_at;
  bool late_reported = false;
  bool finished = false;
  std::int64_t flight_handle = -1;  // its entry in the communicator's FlightRing, if any

  std::atomic<bool> done{false};  // published in issue order
};

class MpiWork final : public Work {
 public:
  explicit MpiWork(std::shared_ptr<Operation> op) : op_(std::move(op)) {}
  void wait() override { op_->done.wait(false, std::memory_order_acquire); }
  bool test() override { return op_->done.load(std::memory_order_acquire); }
  // `started` and `finished_at` are written before `done` is published (release/acquire).
  std::optional<WorkTiming> timing() const override {
    return WorkTiming{op_->started, op_->finished_at};
  }

 private:
  std::shared_ptr<Operation> op_;
};

// The world ranks of the members of `comm`, in its rank order.
std::vector<int> world_ranks_of(MPI_Comm comm) {
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int size = 0;
  MPI_Group_size(group, &size);
  std::vector<int> ranks(static_cast<std::size_t>(size)), world_ranks(ranks.size());
  for (int r = 0; r < size; ++r) ranks[static_cast<std::size_t>(r)] = r;
  MPI_Group_translate_ranks(group, size, ranks.data(), world, world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return world_ranks;
}

// The attribute through which MPI's error handler finds the communicator's reporter.
int reporter_keyval() {
  static const int keyval = [] {
    int created = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, &created, nullptr);
    return created;
  }();
  return keyval;
}

extern "C" void on_mpi_error(MPI_Comm* comm, int* code, ...) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(*code, text, &length);
  void* reporter = nullptr;
  int found = 0;
  MPI_Comm_get_attr(*comm, reporter_keyval(), &reporter, &found);
  if (found && reporter != nullptr)
    (*static_cast<const std::function<void(const std::string&)>*>(reporter))(text);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// MPI errors on `comm` call `reporter` (which writes the flight record), then end the job as
// MPI's default handler would.
void watch_mpi_errors(MPI_Comm comm, const std::function<void(const std::string&)>* reporter) {
  MPI_Comm_set_attr(comm, reporter_keyval(),
                    const_cast<std::function<void(const std::string&)>*>(reporter));
  MPI_Errhandler handler;
  MPI_Comm_create_errhandler(on_mpi_error, &handler);
  MPI_Comm_set_errhandler(comm, handler);
  MPI_Errhandler_free(&handler);
}

// The Work of a collective the fault seam skipped: nothing to wait for.
class SkippedWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

bool is_collective(OpKind kind) { return !is_point_to_point(kind); }

void plan_chunks(Operation& op, std::int64_t elements, std::int64_t max_per_call) {
  op.elements = elements;
  op.chunk = std::min(elements, max_per_call);
  // A zero-sized operation still makes one (empty) MPI call, so that every rank takes part
  // and a missing peer is caught by the timeout just like for a large one.
  op.num_chunks = elements == 0 ? 1 : (elements + op.chunk - 1) / op.chunk;
}

// A block of `count` elements of `base` whose extent is `stride` elements: the view of chunk
// c of every rank block at once, for all_gather and all_to_all on split blocks.
MPI_Datatype strided_block_type(MPI_Datatype base, int count, std::int64_t stride,
                                std::size_t element_size) {
  MPI_Datatype contiguous, strided;
  MPI_Type_contiguous(count, base, &contiguous);
  MPI_Type_create_resized(
      contiguous, 0, static_cast<MPI_Aint>(stride) * static_cast<MPI_Aint>(element_size), &strided);
  MPI_Type_commit(&strided);
  MPI_Type_free(&contiguous);
  return strided;
}

}  // namespace

class MpiCommunicator::Engine {
 public:
  Engine(MPI_Comm parent, std::string group_name, MpiCommunicatorOptions options)
      : name_(std::move(group_name)), options_(std::move(options)) {
    int thread_level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&thread_level);
    OASES_ASSERT(thread_level == MPI_THREAD_MULTIPLE,
                 "MPI communicator '{}' needs MPI initialised with MPI_THREAD_MULTIPLE (create "
                 "an MpiRuntime first)",
                 name_);
    OASES_ASSERT(options_.max_elements_per_call >= 1 &&
                     options_.max_elements_per_call <= std::int64_t{INT_MAX},
                 "max_elements_per_call = {} must lie in [1, {}]", options_.max_elements_per_call,
                 INT_MAX);
    OASES_ASSERT(options_.timeout_seconds >= 0, "timeout_seconds = {} must be >= 0",
                 options_.timeout_seconds);
    OASES_ASSERT(options_.max_bytes_per_call >= 0, "max_bytes_per_call = {} must be >= 0",
                 options_.max_bytes_per_call);
    MPI_Comm_dup(parent, &comm_);
    MPI_Comm_dup(comm_, &exchange_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    int* tag_ub = nullptr;
    int has_tag_ub = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &has_tag_ub);
    max_tag_ = has_tag_ub ? *tag_ub : 32767;  // 32767: the least MPI guarantees
    if (options_.flight) {
      ring_ = options_.flight->add_ring(name_, world_ranks_of(comm_), rank_);
      on_mpi_error_ = [this](const std::string& error) { record_mpi_error(error); };
      watch_mpi_errors(comm_, &on_mpi_error_);
      // MPI reports errors of MPI_Test* on requests of any communicator on MPI_COMM_WORLD:
      // the world group's communicator answers there too while it lives.
      if (parent == MPI_COMM_WORLD) {
        watch_mpi_errors(MPI_COMM_WORLD, &on_mpi_error_);
        watches_world_ = true;
      }
    }
    thread_ = std::thread([this] { progress_loop(); });
  }

  ~Engine() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
    if (watches_world_) {
      MPI_Comm_delete_attr(MPI_COMM_WORLD, reporter_keyval());
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    }
    MPI_Comm_free(&exchange_);
    MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  int max_tag() const { return max_tag_; }
  // The chunk size, in elements per block, of an operation on `blocks` blocks of `dtype`.
  std::int64_t max_per_call(DType dtype, int blocks = 1) const {
    std::int64_t most = options_.max_elements_per_call;
    if (options_.max_bytes_per_call > 0)
      most = std::min(most, std::max<std::int64_t>(
                                1, options_.max_bytes_per_call /
                                       static_cast<std::int64_t>(dtype_size(dtype) *
                                                                 static_cast<std::size_t>(blocks))));
    return most;
  }

  std::unique_ptr<Work> submit(std::shared_ptr<Operation> op, std::string issuer) {
    if (is_collective(op->kind)) {
      if (const CommFault* fault = fault_here(op->kind)) {
        if (fault->kind == CommFault::Kind::skip) return std::make_unique<SkippedWork>();
        shrink(*op);
      }
      ++collectives_issued_;
    }
    if (ring_) {
      FlightOperation record;
      record.kind = kind_name(op->kind);
      record.point_to_point = is_point_to_point(op->kind);
      record.receives = op->kind == OpKind::recv;
      if (record.point_to_point || op->kind == OpKind::broadcast) record.peer = op->peer;
      if (record.point_to_point) record.tag = op->tag;
      record.elements = op->reported;
      record.bytes = op->reported * static_cast<std::int64_t>(dtype_size(op->input.dtype()));
      record.dtype = op->kind == OpKind::barrier ? "" : dtype_name(op->input.dtype());
      record.issuer = std::move(issuer);
      op->flight_handle = ring_->issued(std::move(record));
    }
    auto work = std::make_unique<MpiWork>(op);
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(op));
    }
    wake_.notify_one();
    return work;
  }

 private:
  void progress_loop();
  void start_step(Operation& op);
  // Reduces the chunks an equal-block reduce-scatter received into this rank's block, in rank
  // order, and releases them after the last step.
  void finish_exchange(Operation& op) const {
    const MPI_Datatype type = mpi_type(op.input.dtype());
    const std::size_t bytes =
        static_cast<std::size_t>(op.reduce_count) * dtype_size(op.input.dtype());
    for (int slot = 0; slot + 1 < size_; ++slot)
      MPI_Reduce_local(op.staging.data() + bytes * static_cast<std::size_t>(slot), op.reduce_into,
                       op.reduce_count, type, reduce_op(op.input.dtype(), op.reduce));
    op.reduce_into = nullptr;
    if (op.next_chunk >= op.num_chunks) std::vector<std::byte>().swap(op.staging);
  }
  MPI_Op reduce_op(DType dtype, ReduceOp op) const {
    return dtype == DType::bf16 || dtype == DType::f16 ? ops16_.get(dtype, op) : mpi_op(op);
  }
  void report_late(const Operation& op) const;
  std::string describe(const Operation& op) const;
  void record_mpi_error(const std::string& error) const;
  // The fault of the test seam when it applies to the collective about to be issued, once.
  const CommFault* fault_here(OpKind kind) {
    const auto& fault = options_.fault;
    if (!fault || fault_used_ || fault->world_rank != world_rank_ || fault->group != name_ ||
        fault->seq != collectives_issued_ + 1)
      return nullptr;
    OASES_CHECK(fault->kind == CommFault::Kind::skip || kind == OpKind::all_reduce,
                "OASES_TEST_COMM_FAULT: shrink applies to an all_reduce; collective #{} of group "
                "'{}' is a {}",
                fault->seq, name_, kind_name(kind));
    fault_used_ = true;
    return &*fault;
  }
  static void shrink(Operation& op) {
    const std::int64_t half = op.reported / 2;
    op.input = op.input.reshaped({op.input.numel()}).view(0, {half});
    op.output = op.input;
    op.reported = half;
    plan_chunks(op, half, std::max<std::int64_t>(op.chunk, 1));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  // The point-to-point exchanges inside collectives (equal-block reduce-scatters), apart from
  // the group's own sends and receives; one tag per operation, in issue order.
  MPI_Comm exchange_ = MPI_COMM_NULL;
  std::int64_t exchanges_ = 0;
  int rank_ = 0;
  int size_ = 1;
  int world_rank_ = 0;
  int max_tag_ = 32767;
  std::string name_;
  MpiCommunicatorOptions options_;
  ReduceOps16 ops16_;
  std::shared_ptr<FlightRing> ring_;
  std::function<void(const std::string&)> on_mpi_error_;  // reached from MPI's error handler
  bool watches_world_ = false;  // this communicator's error reporter serves MPI_COMM_WORLD
  std::int64_t collectives_issued_ = 0;  // on the issuing side, for the fault seam
  bool fault_used_ = false;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Operation>> queue_;  // issued, not yet started
  bool stopping_ = false;
  std::thread thread_;  // last: starts once everything above is ready
};

void MpiCommunicator::Engine::progress_loop() {
  std::deque<std::shared_ptr<Operation>> in_flight;  // started, in issue order
  const Operation* blocking = nullptr;  // the collective in flight: nothing starts before it ends
  std::vector<std::shared_ptr<Operation>> admitted;
  auto pause = kFirstPause;
  auto last_progress = Clock::now();
  const bool has_timeout = options_.timeout_seconds > 0;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.timeout_seconds));

#ifdef __linux__
  // Sleeps of a few microseconds would otherwise last the default 50 us timer slack.
  prctl(PR_SET_TIMERSLACK, 1UL);
#endif
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (in_flight.empty()) wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (in_flight.empty() && queue_.empty()) return;  // stopping, and everything is done
      while (blocking == nullptr && !queue_.empty()) {
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
        if (!is_point_to_point(admitted.back()->kind)) blocking = admitted.back().get();
      }
    }
    // Polling from here on when there is work: a stop between here and the turn's end is
    // then a stall too (the wait for work just before it is not).
    if (ring_) ring_->polled(!admitted.empty() || !in_flight.empty());
    // MPI calls happen outside the lock, so issuing never waits on MPI.
    const bool started = !admitted.empty();
    for (auto& op : admitted) {
      op->started = Clock::now();
      if (ring_) ring_->started(op->flight_handle);
      start_step(*op);
      in_flight.push_back(std::move(op));
    }
    admitted.clear();

    bool progressed = false;
    for (auto& op : in_flight) {
      if (op->finished) continue;
      int complete = 0;
      MPI_Testall(static_cast<int>(op->requests.size()), op->requests.data(), &complete,
                  MPI_STATUSES_IGNORE);
      if (!complete) continue;
      progressed = true;
      for (MPI_Datatype& type : op->step_types) MPI_Type_free(&type);
      op->step_types.clear();
      if (op->reduce_into != nullptr) finish_exchange(*op);
      if (op->next_chunk < op->num_chunks) {
        start_step(*op);
      } else {
        op->finished = true;
        op->finished_at = Clock::now();
        if (ring_) ring_->finished(op->flight_handle);
        if (op.get() == blocking) blocking = nullptr;
      }
    }

    if (has_timeout) {
      const auto now = Clock::now();
      for (auto& op : in_flight) {
        if (!op->finished && !op->late_reported && now - op->started > timeout) {
          op->late_reported = true;  // once per operation: a returning handler lets it wait on
          report_late(*op);
        }
      }
    }

    while (!in_flight.empty() && in_flight.front()->finished) {
      Operation& op = *in_flight.front();
      op.done.store(true, std::memory_order_release);
      op.done.notify_all();
      in_flight.pop_front();
    }

    if (started || progressed) {
      last_progress = Clock::now();
      pause = kFirstPause;
    } else if (!in_flight.empty()) {
      if (Clock::now() - last_progress < kSpinWindow) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, kLongestPause);
      }
    }
    // Whether the next turn comes at once (operations in flight) or after a wait for work.
    if (ring_) ring_->polled(!in_flight.empty());
  }
}

// Starts the next chunk of a collective, or every chunk of a send or recv (MPI keeps messages
// between two ranks with one tag in order, so the chunks match up).
void MpiCommunicator::Engine::start_step(Operation& op) {
  const MPI_Datatype type = mpi_type(op.input.dtype());
  const std::size_t element_size = dtype_size(op.input.dtype());
  auto chunk_at = [&](std::int64_t c) {
    const std::int64_t offset = c * op.chunk;
    const int count = static_cast<int>(std::min(op.chunk, op.elements - offset));
    return std::pair{offset, count};
  };
  auto at = [&](const Tensor& t, std::int64_t element_offset) {
    return byte_ptr(t) + element_offset * static_cast<std::int64_t>(element_size);
  };
  const bool whole = op.num_chunks == 1;

  op.requests.clear();
  switch (op.kind) {
    case OpKind::all_reduce: {
      auto [offset, count] = chunk_at(op.next_chunk++);
      op.requests.emplace_back();
      MPI_Iallreduce(MPI_IN_PLACE, at(op.input, offset), count, type, reduce_op(op.input.dtype(), op.reduce), comm_,
                     &op.requests.back());
      break;
    }
    case OpKind::broadcast: {
      auto [offset, count] = chunk_at(op.next_chunk++);
      op.requests.emplace_back();
      MPI_Ibcast(at(op.input, offset), count, type, op.peer, comm_, &op.requests.back());
      break;
    }
    case OpKind::send:
    case OpKind::recv: {
      op.requests.resize(static_cast<std::size_t>(op.num_chunks));
      for (std::int64_t c = 0; c < op.num_chunks; ++c) {
        auto [offset, count] = chunk_at(c);
        MPI_Request* request = &op.requests[static_cast<std::size_t>(c)];
        if (op.kind == OpKind::send) {
          MPI_Isend(at(op.input, offset), count, type, op.peer, op.tag, comm_, request);
        } else {
          MPI_Irecv(at(op.input, offset), count, type, op.peer, op.tag, comm_, request);
        }
      }
      op.next_chunk = op.num_chunks;
      break;
    }
    case OpKind::all_gather: {
      auto [offset, count] = chunk_at(op.next_chunk++);
      const void* send = op.in_place ? MPI_IN_PLACE : at(op.input, offset);
      op.requests.emplace_back();
      if (whole) {
        MPI_Iallgather(send, count, type, op.output.raw(), count, type, comm_, &op.requests.back());
      } else {
        // Chunk c of every rank's block lands at block * rank + offset of the output.
        MPI_Datatype strided = strided_block_type(type, count, op.elements, element_size);
        op.step_types.push_back(strided);
        MPI_Iallgather(send, count, type, at(op.output, offset), 1, strided, comm_,
                       &op.requests.back());
      }
      break;
    }
    case OpKind::all_to_all: {
      auto [offset, count] = chunk_at(op.next_chunk++);
      op.requests.emplace_back();
      if (whole) {
        MPI_Ialltoall(op.input.raw(), count, type, op.output.raw(), count, type, comm_,
                      &op.requests.back());
      } else {
        MPI_Datatype strided = strided_block_type(type, count, op.elements, element_size);
        op.step_types.push_back(strided);
        MPI_Ialltoall(at(op.input, offset), 1, strided, at(op.output, offset), 1, strided, comm_,
                      &op.requests.back());
      }
      break;
    }
    case OpKind::reduce_scatter: {
      auto [offset, count] = chunk_at(op.next_chunk++);
      if (whole) {
        op.requests.emplace_back();
        MPI_Ireduce_scatter_block(op.input.raw(), op.output.raw(), count, type, reduce_op(op.input.dtype(), op.reduce),
                                  comm_, &op.requests.back());
      } else {
        // A strided derived type would need the reduction to run on derived types; one
        // reduction per destination block keeps every MPI call on a basic type instead.
        op.requests.resize(static_cast<std::size_t>(size_));
        for (int root = 0; root < size_; ++root) {
          void* receive = root == rank_ ? at(op.output, offset) : nullptr;
          MPI_Ireduce(at(op.input, op.elements * root + offset), receive, count, type,
                      reduce_op(op.input.dtype(), op.reduce), root, comm_, &op.requests[static_cast<std::size_t>(root)]);
        }
      }
      break;
    }
    case OpKind::all_to_allv: {
      const auto n = static_cast<std::size_t>(size_);
      const int* args = op.alltoallv_args.data();
      op.requests.emplace_back();
      MPI_Ialltoallv(op.input.raw(), args, args + n, type, op.output.raw(), args + 2 * n,
                     args + 3 * n, type, comm_, &op.requests.back());
      op.next_chunk = op.num_chunks;
      break;
    }
    case OpKind::reduce_scatter_blocks:
      if (std::ranges::all_of(op.block_counts,
                              [&](std::int64_t n) { return n == op.block_counts[0]; })) {
        // Equal blocks (sequence parallelism's reduce-scatters, evenly cut ZeRO buckets): each
        // rank sends every other rank its chunk of that rank's block and reduces what it
        // receives into its own, the bytes of a ring reduce-scatter. Open MPI's in-place
        // alternatives measured far slower here: one MPI_Ireduce per block (below) over shared
        // memory, MPI_Ireduce_scatter_block (which returns the result at the buffer's start)
        // over TCP (bench/collective_bandwidth.cc).
        const std::int64_t block = op.block_counts[0];
        const std::int64_t first = op.next_chunk++ * op.chunk;
        const int count = static_cast<int>(std::clamp<std::int64_t>(block - first, 0, op.chunk));
        const std::size_t bytes = static_cast<std::size_t>(count) * element_size;
        if (op.exchange_tag < 0)
          op.exchange_tag = static_cast<int>(exchanges_++ % (std::min(max_tag_, 32767) + 1));
        op.staging.resize(bytes * static_cast<std::size_t>(size_ - 1));
        std::size_t slot = 0;
        for (int peer = 0; peer < size_; ++peer) {
          if (peer == rank_) continue;
          op.requests.emplace_back();
          MPI_Irecv(op.staging.data() + bytes * slot++, count, type, peer, op.exchange_tag,
                    exchange_, &op.requests.back());
        }
        for (int peer = 0; peer < size_; ++peer) {
          if (peer == rank_) continue;
          op.requests.emplace_back();
          MPI_Isend(at(op.input, block * peer + first), count, type, peer, op.exchange_tag,
                    exchange_, &op.requests.back());
        }
        op.reduce_into = at(op.input, block * rank_ + first);
        op.reduce_count = count;
        break;
      }
      [[fallthrough]];
    case OpKind::all_gather_blocks: {
      // One reduction to (or broadcast from) each block's owner per chunk: in place at the
      // owner, on basic types, whatever the blocks' sizes.
      const std::int64_t first = op.next_chunk++ * op.chunk;
      std::int64_t block_offset = 0;
      for (int root = 0; root < size_; ++root) {
        const std::int64_t length = op.block_counts[static_cast<std::size_t>(root)];
        const int count = static_cast<int>(std::clamp<std::int64_t>(length - first, 0, op.chunk));
        char* piece = at(op.input, block_offset + first);
        block_offset += length;
        if (count == 0) continue;
        op.requests.emplace_back();
        if (op.kind == OpKind::all_gather_blocks) {
          MPI_Ibcast(piece, count, type, root, comm_, &op.requests.back());
        } else {
          MPI_Ireduce(root == rank_ ? MPI_IN_PLACE : piece, piece, count, type,
                      reduce_op(op.input.dtype(), op.reduce), root, comm_, &op.requests.back());
        }
      }
      break;
    }
    case OpKind::barrier: {
      op.requests.emplace_back();
      MPI_Ibarrier(comm_, &op.requests.back());
      op.next_chunk = op.num_chunks;
      break;
    }
  }
}

std::string MpiCommunicator::Engine::describe(const Operation& op) const {
  const auto dtype = dtype_name(op.input.dtype());
  switch (op.kind) {
    case OpKind::barrier: return "barrier";
    case OpKind::send:
      return fmt::format("send of {} {} to rank {} (tag {})", op.reported, dtype, op.peer, op.tag);
    case OpKind::recv:
      return fmt::format("recv of {} {} from rank {} (tag {})", op.reported, dtype, op.peer,
                         op.tag);
    case OpKind::broadcast:
      return fmt::format("broadcast of {} {} from rank {}", op.reported, dtype, op.peer);
    default: return fmt::format("{} of {} {}", kind_name(op.kind), op.reported, dtype);
  }
}

void MpiCommunicator::Engine::report_late(const Operation& op) const {
  std::string message = fmt::format(
      "oases: {} on group '{}' (size {}) has not completed after {:g} s on rank {} (world rank "
      "{}); a peer is missing or stuck",
      describe(op), name_, size_, options_.timeout_seconds, rank_, world_rank_);
  if (options_.flight) {
    const std::string written = options_.flight->dump_now("collective timeout: " + message);
    if (!written.empty())
      message += fmt::format(
          "; flight record written to {} (`oases flight {}` names the rank behind)", written,
          std::filesystem::path(options_.flight->directory()).parent_path().string());
  }
  if (options_.on_timeout) {
    options_.on_timeout(message);
    return;
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

void MpiCommunicator::Engine::record_mpi_error(const std::string& error) const {
  // MPI_COMM_WORLD's handler cannot tell the group of a request: name none then.
  const std::string where =
      watches_world_ ? fmt::format("world rank {}", world_rank_)
                     : fmt::format("group '{}' (size {}), rank {} (world rank {})", name_, size_,
                                   rank_, world_rank_);
  const std::string written = options_.flight->dump_now(fmt::format("MPI error on {}: {}", where, error));
  std::fprintf(stderr, "oases: MPI error on %s: %s%s\n", where.c_str(), error.c_str(),
               written.empty() ? "" : ("; flight record written to " + written).c_str());
  std::fflush(stderr);
}

namespace {

void check_buffer(const Tensor& t, const char* op, const char* which, const std::string& group) {
  OASES_ASSERT(mpi_type(t.dtype()) != MPI_DATATYPE_NULL,
               "{} on group '{}': {} holds {}; the MPI backend moves f32, f64, bf16, f16, i32 and i64", op,
               group, which, dtype_name(t.dtype()));
  OASES_ASSERT(t.numel() == 0 || t.raw() != nullptr, "{} on group '{}': {} {} has no data", op,
               group, which, t.shape().str());
  OASES_ASSERT(t.is_contiguous() && t.device().is_cpu(),
               "{} on group '{}': {} must be a contiguous CPU tensor ({} on {})", op, group, which,
               t.shape().str(), t.device().str());
}

void check_same_dtype(const Tensor& input, const Tensor& output, const char* op,
                      const std::string& group) {
  OASES_ASSERT(input.dtype() == output.dtype(), "{} on group '{}': input is {}, output is {}", op,
               group, dtype_name(input.dtype()), dtype_name(output.dtype()));
}

void check_disjoint(const Tensor& input, const Tensor& output, const char* op,
                    const std::string& group) {
  OASES_ASSERT(!overlap(input, output),
               "{} on group '{}': input and output overlap; they must be separate buffers", op,
               group);
}

std::shared_ptr<Operation> new_operation(OpKind kind, Tensor input, Tensor output) {
  auto op = std::make_shared<Operation>();
  op->kind = kind;
  op->input = input;
  op->output = output;
  op->requests.reserve(1);
  return op;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string group_name,
                                 MpiCommunicatorOptions options)
    : engine_(std::make_unique<Engine>(comm, std::move(group_name), std::move(options))) {}

MpiCommunicator::~MpiCommunicator() = default;

int MpiCommunicator::rank() const { return engine_->rank(); }
int MpiCommunicator::size() const { return engine_->size(); }
std::string MpiCommunicator::name() const { return engine_->name(); }

std::unique_ptr<Work> MpiCommunicator::all_reduce_async(Tensor buffer, ReduceOp op) {
  check_buffer(buffer, "all_reduce", "buffer", name());
  auto operation = new_operation(OpKind::all_reduce, buffer, buffer);
  operation->reduce = op;
  operation->reported = buffer.numel();
  plan_chunks(*operation, buffer.numel(), engine_->max_per_call(buffer.dtype()));
  return engine_->submit(std::move(operation), issuer());
}

std::unique_ptr<Work> MpiCommunicator::all_gather_async(Tensor input, Tensor output) {
  check_buffer(input, "all_gather", "input", name());
  check_buffer(output, "all_gather", "output", name());
  check_same_dtype(input, output, "all_gather", name());
  const std::int64_t n = input.numel();
  OASES_ASSERT(output.numel() == n * size(),
               "all_gather on group '{}' (size {}): output {} must hold size * {} elements", name(),
               size(), output.shape().str(), n);
  const auto element_size = static_cast<std::int64_t>(dtype_size(input.dtype()));
  const bool in_place = n > 0 && input.raw() == byte_ptr(output) + n * rank() * element_size;
  if (!in_place) check_disjoint(input, output, "all_gather", name());
  auto operation = new_operation(OpKind::all_gather, input, output);
  operation->in_place = in_place;
  operation->reported = n;
  plan_chunks(*operation, n, engine_->max_per_call(input.dtype(), size()));
  return engine_->submit(std::move(operation), issuer());
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter_async(Tensor input, Tensor output,
                                                            ReduceOp op) {
  check_buffer(input, "reduce_scatter", "input", name());
  check_buffer(output, "reduce_scatter", "output", name());
  check_same_dtype(input, output, "reduce_scatter", name());
  const std::int64_t n = output.numel();
  OASES_ASSERT(input.numel() == n * size(),
               "reduce_scatter on group '{}' (size {}): input {} must hold size * {} elements",
               name(), size(), input.shape().str(), n);
  check_disjoint(input, output, "reduce_scatter", name());
  auto operation = new_operation(OpKind::reduce_scatter, input, output);
  operation->reduce = op;
  operation->reported = input.numel();
  plan_chunks(*operation, n, engine_->max_per_call(input.dtype(), size()));
  return engine_->submit(std::move(operation), issuer());
}

std::unique_ptr<Work> MpiCommunicator::broadcast_async(Tensor buffer, int root) {
  check_buffer(buffer, "broadcast", "buffer", name());
  OASES_ASSERT(root >= 0 && root < size(), "broadcast on group '{}' (size {}) from rank {}", name(),
               size(), root);
  auto operation = new_operation(OpKind::broadcast, buffer, buffer);
  operation->peer = root;
  operation->reported = buffer.numel();
  plan_chunks(*operation, buffer.numel(), engine_->max_per_call(buffer.dtype()));
  return engine_->submit(std::move(operation), issuer());
}

std::unique_ptr<Work> MpiCommunicator::send_async(Tensor buffer, int peer, int tag) {
  check_buffer(buffer, "send", "buffer", name());
  OASES_ASSERT(peer >= 0 && peer < size(), "send on group '{}' (size {}) to rank {}", name(),
               size(), peer);
  OASES_ASSERT(tag >= 0 && tag <= engine_->max_tag(), "send on group '{}': tag {} outside [0, {}]",
               name(), tag, engine_->max_tag());
  auto operation = new_operation(OpKind::send, buffer, buffer);
  operation->peer = peer;
  operation->tag = tag;
  operation->reported = buffer.numel();
  plan_chunks(*operation, buffer.numel(), engine_->max_per_call(buffer.dtype()));
  return engine_->submit(std::move(operation), issuer());
}

std::unique_ptr<Work> MpiCommunicator::recv_async(Tensor buffer, int peer, int tag) {
  check_buffer(buffer, "recv", "buffer", name());
  OASES_ASSERT(peer >= 0 && peer < size(), "recv on group '{}' (size {}) from rank {}", name(),
               size(), peer);
  OASES_ASSERT(tag >= 0 && tag <= engine_->max_tag(), "recv on group '{}': tag {} outside [0, {}]",
               name(), tag, engine_->max_tag());
  auto operation = new_operation(OpKind::recv, buffer, buffer);
  operation->peer = peer;
  operation->tag = tag;
  operation->reported = buffer.numel();
  plan_chunks(*operation, buffer.numel(), engine_->max_per_call(buffer.dtype()));
  return engine_->submit(std::move(operation), issuer());
}

std::unique_ptr<Work> MpiCommunicator::all_to_all_async(Tensor input, Tensor output) {
  check_buffer(input, "all_to_all", "input", name());
  check_buffer(output, "all_to_all", "output", name());
  check_same_dtype(input, output, "all_to_all", name());
  OASES_ASSERT(input.numel() == output.numel() && input.numel() % size() == 0,
               "all_to_all on group '{}' (size {}): input {} and output {} must hold the same "
               "multiple of the group size",
               name(), size(), input.shape().str(), output.shape().str());
  check_disjoint(input, output, "all_to_all", name());
  auto operation = new_operation(OpKind::all_to_all, input, output);
  operation->reported = input.numel();
  plan_chunks(*operation, input.numel() / size(), engine_->max_per_call(input.dtype(), size()));
  return engine_->submit(std::move(operation), issuer());
}

std::unique_ptr<Work> MpiCommunicator::all_to_allv_async(Tensor input,
                                                         std::vector<std::int64_t> send_counts,
                                                         Tensor output,
                                                         std::vector<std::int64_t> recv_counts) {
  check_buffer(input, "all_to_allv", "input", name());
  check_buffer(output, "all_to_allv", "output", name());
  check_same_dtype(input, output, "all_to_allv", name());
  const auto n = static_cast<std::size_t>(size());
  OASES_ASSERT(send_counts.size() == n && recv_counts.size() == n,
               "all_to_allv on group '{}' (size {}): {} send counts and {} recv counts", name(),
               size(), send_counts.size(), recv_counts.size());
  check_disjoint(input, output, "all_to_allv", name());

  // Layout: [send counts | send offsets | recv counts | recv offsets], each of group size.
  std::vector<int> args(4 * n);
  std::int64_t total_sent = 0, total_received = 0;
  auto fill = [&](const std::vector<std::int64_t>& counts, std::size_t base, std::int64_t& total,
                  const char* direction) {
    for (std::size_t j = 0; j < n; ++j) {
      OASES_ASSERT(counts[j] >= 0, "all_to_allv on group '{}': {} count {} for rank {}", name(),
                   direction, counts[j], j);
      OASES_CHECK(counts[j] <= INT_MAX && total <= INT_MAX,
                  "all_to_allv on group '{}': {} count {} at offset {} (rank {}) exceeds the MPI "
                  "limit of {} elements per count or offset; split the exchange",
                  name(), direction, counts[j], total, j, INT_MAX);
      args[base + j] = static_cast<int>(counts[j]);
      args[base + n + j] = static_cast<int>(total);
      total += counts[j];
    }
  };
  fill(send_counts, 0, total_sent, "send");
  fill(recv_counts, 2 * n, total_received, "recv");
  OASES_ASSERT(total_sent <= input.numel() && total_received <= output.numel(),
               "all_to_allv on group '{}': sends {} elements from input {} and receives {} into "
               "output {}",
               name(), total_sent, input.shape().str(), total_received, output.shape().str());

  auto operation = new_operation(OpKind::all_to_allv, input, output);
  operation->alltoallv_args = std::move(args);
  operation->reported = total_sent;
  plan_chunks(*operation, 0, engine_->max_per_call(input.dtype()));
  return engine_->submit(std::move(operation), issuer());
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter_blocks_async(
    Tensor buffer, std::vector<std::int64_t> counts, ReduceOp op) {
  check_buffer(buffer, "reduce_scatter_blocks", "buffer", name());
  check_blocks(buffer, counts, "reduce_scatter_blocks");
  auto operation = new_operation(OpKind::reduce_scatter_blocks, buffer, buffer);
  operation->reduce = op;
  operation->reported = buffer.numel();
  plan_chunks(*operation, std::ranges::max(counts), engine_->max_per_call(buffer.dtype(), size()));
  operation->block_counts = std::move(counts);
  return engine_->submit(std::move(operation), issuer());
}

std::unique_ptr<Work> MpiCommunicator::all_gather_blocks_async(Tensor buffer,
                                                               std::vector<std::int64_t> counts) {
  check_buffer(buffer, "all_gather_blocks", "buffer", name());
  check_blocks(buffer, counts, "all_gather_blocks");
  auto operation = new_operation(OpKind::all_gather_blocks, buffer, buffer);
  operation->reported = buffer.numel();
  plan_chunks(*operation, std::ranges::max(counts), engine_->max_per_call(buffer.dtype(), size()));
  operation->block_counts = std::move(counts);
  return engine_->submit(std::move(operation), issuer());
}

std::unique_ptr<Work> MpiCommunicator::barrier_async() {
  auto operation = new_operation(OpKind::barrier, Tensor(), Tensor());
  plan_chunks(*operation, 0, 1);
  return engine_->submit(std::move(operation), issuer());
}

}  // namespace oases::comm
