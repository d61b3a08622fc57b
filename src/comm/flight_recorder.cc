#include "comm/flight_recorder.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/stop_signals.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>

namespace oases::comm {
namespace {

// What the signal handlers reach: the write end of the dump thread's pipe and the flag the
// thread raises once a fatal signal's record is written. Lock-free atomics only.
std::atomic<int> dump_wake_fd{-1};
std::atomic<bool> fatal_record_written{false};
std::atomic<bool> recorder_watching{false};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

constexpr std::array kFatalSignals{SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
// The actions before ours, restored when the recorder goes and used by the handler to let a
// fatal signal take its course. Written before the handlers are installed, read-only after.
struct sigaction previous_fatal_actions[kFatalSignals.size()];
struct sigaction previous_usr2_action;

// A wake-up byte: the signal number, or 0 to stop the dump thread.
void wake_dump_thread(unsigned char byte) {
  const int fd = dump_wake_fd.load();
  if (fd < 0) return;
  [[maybe_unused]] const ssize_t written = write(fd, &byte, 1);
}

extern "C" void on_dump_request(int signal_number) {
  wake_dump_thread(static_cast<unsigned char>(signal_number));
}

extern "C" void on_fatal_signal(int signal_number, siginfo_t* info, void* context) {
  std::size_t which = 0;
  while (which < kFatalSignals.size() && kFatalSignals[which] != signal_number) ++which;
  if (dump_wake_fd.load() >= 0) {
    fatal_record_written.store(false);
    wake_dump_thread(static_cast<unsigned char>(signal_number));
    // At most 2 s: the thread may be blocked by the very fault being reported.
    const timespec pause{0, 10'000'000};
    for (int waited = 0; waited < 200 && !fatal_record_written.load(); ++waited)
      nanosleep(&pause, nullptr);
  }
  if (which == kFatalSignals.size()) return;
  const struct sigaction& previous = previous_fatal_actions[which];
  sigaction(signal_number, &previous, nullptr);
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction != nullptr) previous.sa_sigaction(signal_number, info, context);
    return;
  }
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signal_number);
    return;
  }
  // Blocked while this handler runs: delivered, with its default action, once it returns
  // (also for a signal sent by kill, whose faulting instruction would not run again).
  raise(signal_number);
}

double unix_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

const char* state_name(FlightState state) {
  switch (state) {
    case FlightState::issued: return "issued";
    case FlightState::started: return "started";
    case FlightState::finished: return "finished";
  }
  return "?";
}

}  // namespace

std::string flight_host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

FlightRing::FlightRing(std::string group, std::vector<int> members, int rank,
                       std::int64_t capacity)
    : group_(std::move(group)), members_(std::move(members)), rank_(rank) {
  OASES_ASSERT(capacity >= 1, "a flight ring of {} entries", capacity);
  entries_.resize(static_cast<std::size_t>(capacity));
}

std::int64_t FlightRing::issued(FlightOperation op) {
  const auto now_wall = std::chrono::system_clock::now();
  std::lock_guard lock(mutex_);
  const std::int64_t handle = next_handle_++;
  FlightEntry& e = entries_[static_cast<std::size_t>(handle % static_cast<std::int64_t>(entries_.size()))];
  e.seq = op.point_to_point ? ++messages_[{op.peer, op.receives}] : ++collectives_;
  e.op = std::move(op);
  e.state = FlightState::issued;
  e.issued_at = now_wall;
  e.started_at = e.finished_at = {};
  e.began = std::chrono::steady_clock::now();
  return handle;
}

FlightEntry* FlightRing::find(std::int64_t handle) {
  // An entry overwritten since (more than `capacity` operations later) is gone.
  if (handle < next_handle_ - static_cast<std::int64_t>(entries_.size())) return nullptr;
  return &entries_[static_cast<std::size_t>(handle % static_cast<std::int64_t>(entries_.size()))];
}

void FlightRing::started(std::int64_t handle) {
  const auto wall = std::chrono::system_clock::now();
  const auto steady = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  if (FlightEntry* e = find(handle)) {
    e->state = FlightState::started;
    e->started_at = wall;
    e->began = steady;
  }
}

void FlightRing::finished(std::int64_t handle) {
  const auto wall = std::chrono::system_clock::now();
  std::lock_guard lock(mutex_);
  if (FlightEntry* e = find(handle)) {
    e->state = FlightState::finished;
    e->finished_at = wall;
  }
}

namespace {
std::int64_t steady_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
}  // namespace

void FlightRing::polled(bool in_flight) {
  const std::int64_t now = steady_ns(std::chrono::steady_clock::now());
  const std::int64_t gap = now - last_poll_ns_.load(std::memory_order_relaxed);
  if (polling_.load(std::memory_order_relaxed) &&
      gap > static_cast<std::int64_t>(kStallSeconds * 1e9) &&
      gap > longest_stall_ns_.load(std::memory_order_relaxed)) {
    longest_stall_ns_.store(gap, std::memory_order_relaxed);
    stall_ended_at_.store(unix_seconds(std::chrono::system_clock::now()),
                          std::memory_order_relaxed);
  }
  last_poll_ns_.store(now, std::memory_order_relaxed);
  polling_.store(in_flight, std::memory_order_relaxed);
}

nlohmann::json FlightRing::to_json(std::chrono::steady_clock::time_point now) const {
  std::int64_t stall = longest_stall_ns_.load(std::memory_order_relaxed);
  double stall_ended_at = stall_ended_at_.load(std::memory_order_relaxed);
  if (polling_.load(std::memory_order_relaxed)) {
    const std::int64_t ongoing = steady_ns(now) - last_poll_ns_.load(std::memory_order_relaxed);
    if (ongoing > static_cast<std::int64_t>(kStallSeconds * 1e9) && ongoing > stall) {
      stall = ongoing;
      stall_ended_at = unix_seconds(std::chrono::system_clock::now());
    }
  }
  std::lock_guard lock(mutex_);
  nlohmann::json operations = nlohmann::json::array();
  const auto capacity = static_cast<std::int64_t>(entries_.size());
  for (std::int64_t h = std::max<std::int64_t>(0, next_handle_ - capacity); h < next_handle_; ++h) {
    const FlightEntry& e = entries_[static_cast<std::size_t>(h % capacity)];
    nlohmann::json op{{"seq", e.seq},
                      {"kind", e.op.kind},
                      {"elements", e.op.elements},
                      {"bytes", e.op.bytes},
                      {"dtype", std::string(e.op.dtype)},
                      {"issuer", e.op.issuer},
                      {"state", state_name(e.state)},
                      {"issued_at", unix_seconds(e.issued_at)}};
    if (e.op.peer >= 0) op["peer"] = e.op.peer;
    if (e.op.tag >= 0) op["tag"] = e.op.tag;
    if (e.state != FlightState::issued) op["started_at"] = unix_seconds(e.started_at);
    if (e.state == FlightState::finished) {
      op["finished_at"] = unix_seconds(e.finished_at);
    } else {
      op["waited_s"] = std::chrono::duration<double>(now - e.began).count();
    }
    operations.push_back(std::move(op));
  }
  nlohmann::json messages = nlohmann::json::array();
  for (const auto& [key, count] : messages_)
    messages.push_back({{"peer", key.first}, {"direction", key.second ? "recv" : "send"},
                        {"count", count}});
  nlohmann::json out{{"group", group_},
                     {"members", members_},
                     {"rank", rank_},
                     {"collectives_issued", collectives_},
                     {"messages", std::move(messages)},
                     {"longest_stall_s", static_cast<double>(stall) * 1e-9},
                     {"operations", std::move(operations)}};
  if (stall > 0) out["stall_ended_at"] = stall_ended_at;
  return out;
}

FlightRecorder::FlightRecorder(std::string directory, FlightIdentity identity,
                               std::int64_t capacity)
    : directory_(std::move(directory)), identity_(std::move(identity)), capacity_(capacity) {
  OASES_ASSERT(capacity_ >= 1, "log.flight_records = {} reached the recorder", capacity_);
}

FlightRecorder::~FlightRecorder() {
  if (!watching_) return;
  for (std::size_t i = 0; i < kFatalSignals.size(); ++i)
    sigaction(kFatalSignals[i], &previous_fatal_actions[i], nullptr);
  sigaction(SIGUSR2, &previous_usr2_action, nullptr);
  wake_dump_thread(0);
  dumper_.join();
  dump_wake_fd.store(-1);
  close(wake_pipe_[0]);
  close(wake_pipe_[1]);
  recorder_watching.store(false);
}

std::shared_ptr<FlightRing> FlightRecorder::add_ring(std::string group, std::vector<int> members,
                                                     int rank) {
  auto ring = std::make_shared<FlightRing>(std::move(group), std::move(members), rank, capacity_);
  std::lock_guard lock(rings_mutex_);
  rings_.push_back(ring);
  return ring;
}

bool FlightRecorder::has_operations() const {
  std::lock_guard lock(rings_mutex_);
  return std::any_of(rings_.begin(), rings_.end(), [](const auto& ring) { return !ring->empty(); });
}

std::string FlightRecorder::path() const {
  return (std::filesystem::path(directory_) / fmt::format("rank_{}.json", identity_.world_rank))
      .string();
}

std::string FlightRecorder::dump_now(const std::string& reason) const {
  std::lock_guard dump_lock(dump_mutex_);
  const auto now = std::chrono::steady_clock::now();
  nlohmann::json groups = nlohmann::json::array();
  {
    std::lock_guard lock(rings_mutex_);
    for (const auto& ring : rings_) groups.push_back(ring->to_json(now));
  }
  const nlohmann::json record{
      {"format", "oases-flight-1"},
      {"rank", identity_.world_rank},
      {"world_size", identity_.world_size},
      {"host", identity_.host},
      {"hosts", identity_.rank_hosts},
      {"pid", static_cast<long>(getpid())},
      {"reason", reason},
      {"written_at", unix_seconds(std::chrono::system_clock::now())},
      {"groups", std::move(groups)}};
  try {
    std::filesystem::create_directories(directory_);
    write_file_atomically(path(), record.dump(1) + "\n");
  } catch (const std::exception& e) {
    std::fputs(fmt::format("oases: rank {}: could not write the flight record {}: {}\n",
                           identity_.world_rank, path(), e.what())
                   .c_str(),
               stderr);
    return "";
  }
  return path();
}

void FlightRecorder::watch_signals() {
  OASES_ASSERT(!watching_, "the flight recorder watches signals twice");
  OASES_ASSERT(!recorder_watching.exchange(true),
               "two flight recorders watch signals in one process");
  OASES_ASSERT(pipe(wake_pipe_) == 0, "cannot create the flight recorder's pipe");
  dump_wake_fd.store(wake_pipe_[1]);
  watching_ = true;
  dumper_ = std::thread([this] { dump_loop(); });

  struct sigaction usr2{};
  usr2.sa_handler = on_dump_request;
  sigemptyset(&usr2.sa_mask);
  usr2.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &usr2, &previous_usr2_action);

  struct sigaction fatal{};
  fatal.sa_sigaction = on_fatal_signal;
  sigemptyset(&fatal.sa_mask);
  fatal.sa_flags = SA_SIGINFO | SA_RESTART;
  for (std::size_t i = 0; i < kFatalSignals.size(); ++i) {
    sigaction(kFatalSignals[i], nullptr, &previous_fatal_actions[i]);
    sigaction(kFatalSignals[i], &fatal, nullptr);
  }
}

void FlightRecorder::dump_loop() {
  bool stop_recorded = false;
  for (;;) {
    pollfd wake{wake_pipe_[0], POLLIN, 0};
    const int ready = poll(&wake, 1, 50);
    if (ready > 0) {
      unsigned char byte = 0;
      if (read(wake_pipe_[0], &byte, 1) != 1) continue;
      if (byte == 0) return;
      const int signal_number = byte;
      if (signal_number == SIGUSR2) {
        const std::string written = dump_now("SIGUSR2");
        if (!written.empty())
          std::fputs(fmt::format("oases: rank {}: SIGUSR2: flight record written to {}\n",
                                 identity_.world_rank, written)
                         .c_str(),
                     stderr);
      } else {
        const char* abbreviation = sigabbrev_np(signal_number);
        dump_now(fmt::format("fatal signal SIG{}", abbreviation ? abbreviation : "?"));
        fatal_record_written.store(true);
      }
      continue;
    }
    if (!stop_recorded) {
      if (const int stop = stop_signal_received(); stop != 0) {
        stop_recorded = true;
        dump_now(fmt::format("stop signal {}", signal_name(stop)));
      }
    }
  }
}

std::optional<CommFault> comm_fault_from_environment() {
  constexpr const char* kVariable = "OASES_TEST_COMM_FAULT";
  const char* value = std::getenv(kVariable);
  if (value == nullptr || *value == '\0') return std::nullopt;
  const std::string text = value;
  std::vector<std::string> parts;
  for (std::size_t begin = 0;;) {
    const std::size_t colon = text.find(':', begin);
    parts.push_back(text.substr(begin, colon - begin));
    if (colon == std::string::npos) break;
    begin = colon + 1;
  }
  const auto malformed = [&] {
    return UserError(fmt::format(
        "{}=\"{}\" is not <skip|shrink>:<world rank>:<group>:<collective number>, e.g. "
        "skip:3:tp:418",
        kVariable, text));
  };
  if (parts.size() != 4 || (parts[0] != "skip" && parts[0] != "shrink") || parts[2].empty())
    throw malformed();
  CommFault fault;
  fault.kind = parts[0] == "skip" ? CommFault::Kind::skip : CommFault::Kind::shrink;
  fault.group = parts[2];
  try {
    std::size_t used = 0;
    fault.world_rank = std::stoi(parts[1], &used);
    if (used != parts[1].size() || fault.world_rank < 0) throw malformed();
    fault.seq = std::stoll(parts[3], &used);
    if (used != parts[3].size() || fault.seq < 1) throw malformed();
  } catch (const std::logic_error&) {
    throw malformed();
  }
  return fault;
}

}  // namespace oases::comm
