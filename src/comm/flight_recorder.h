// FlightRecorder: what each communicator of this process did last, kept in memory and written
// to a file when a job hangs or dies, so that `oases flight` can name the rank it waits for.
//
// Each MpiCommunicator owns a FlightRing of the last `capacity` operations issued on it (the
// ring overwrites the oldest). An entry holds:
//   seq        collectives: 1, 2, ... in issue order on this group (every member of the group
//              issues the same collectives in the same order, so #418 on one rank is #418 on
//              every other); sends and recvs: 1, 2, ... per peer and direction
//   kind       "all_reduce", "send", ... (the communicator's operation)
//   peer, tag  sends and recvs (peer within the group), broadcasts (root); -1 otherwise
//   elements, bytes, dtype
//   issuer     what issued it: the schedule instruction's text ("F(attention.5, mb=1, ...)"),
//              or a label such as "reduce_grads(bucket=3)"; empty when nobody said
//   state      issued (queued behind earlier operations), started (on the wire), finished
//   times      wall-clock seconds (issued_at, started_at, finished_at) and, for an operation
//              not finished when the record is written, how long it has waited since it began
//
// The FlightRecorder of a process holds every ring and writes them all as one JSON document,
// <directory>/rank_<R>.json (written to a temporary and renamed, so a reader never sees half
// a file; a later dump replaces an earlier one), when:
//   - a communicator's operation passes the collective timeout (parallel.comm_timeout_s),
//   - MPI reports an error on a communicator,
//   - the start-up timeout fires (dump_now from the start-up watchdog),
//   - a fatal signal arrives (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT): the handler wakes the
//     dump thread, waits for it at most 2 s, then lets the signal take its course,
//   - SIGUSR2 arrives: the record is written and the process goes on,
//   - a stop signal is received (core/stop_signals.h; the TERM an mpirun sends every rank when
//     one of them aborts included): where each rank was when asked to stop.
// Dumps are done by a thread of the recorder's own, never inside a signal handler.
//
// Cost: one short lock per operation at issue, start and finish; no allocation after the ring
// has filled, except the issuer label's string.
//
// Process-wide: one FlightRecorder with signal handlers at a time (the handlers reach it
// through one atomic pointer); a second is an InternalError.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace oases::comm {

// The default number of operations each communicator remembers (log.flight_records).
inline constexpr std::int64_t kDefaultFlightRecords = 2000;

enum class FlightState { issued, started, finished };

// What a communicator tells its ring about one operation at issue.
struct FlightOperation {
  const char* kind = "";
  bool point_to_point = false;  // numbered per peer and direction, not as a collective
  bool receives = false;        // the direction of a point-to-point operation
  int peer = -1;
  int tag = -1;
  std::int64_t elements = 0;
  std::int64_t bytes = 0;
  std::string_view dtype;  // a name with static storage (dtype_name)
  std::string issuer;
};

// One operation in a ring: what was issued, its number and how far it got.
struct FlightEntry {
  std::int64_t seq = 0;
  FlightOperation op;
  FlightState state = FlightState::issued;
  std::chrono::system_clock::time_point issued_at, started_at, finished_at;
  std::chrono::steady_clock::time_point began;  // for the wait, measured on one clock
};

class FlightRing {
 public:
  // `members`: the world ranks of the group, in group order; `rank`: this process's rank in it.
  FlightRing(std::string group, std::vector<int> members, int rank, std::int64_t capacity);

  // Records an issued operation; the handle names it in started() and finished().
  std::int64_t issued(FlightOperation op);
  void started(std::int64_t handle);
  void finished(std::int64_t handle);

  // Called by the communicator's progress thread on each turn of its loop; `in_flight`: it
  // polls operations (so the next turn comes within a fraction of a millisecond). A gap of
  // more than kStallSeconds while polling means the thread did not run: the process was
  // stopped (SIGSTOP, a debugger) or starved of CPU. The longest such gap is kept.
  void polled(bool in_flight);
  static constexpr double kStallSeconds = 0.5;

  // The group and its last `capacity` operations, oldest first:
  //   {"group", "members", "rank", "collectives_issued", "messages": [{"peer", "direction",
  //    "count"}], "longest_stall_s", "stall_ended_at" (when there was one), "operations": [...]}
  // A stall still going on when the record is written counts up to that moment.
  nlohmann::json to_json(std::chrono::steady_clock::time_point now) const;

  const std::string& group() const { return group_; }
  bool empty() const {
    std::lock_guard lock(mutex_);
    return next_handle_ == 0;
  }

 private:
  FlightEntry* find(std::int64_t handle);

  std::string group_;
  std::vector<int> members_;
  int rank_;
  mutable std::mutex mutex_;
  std::vector<FlightEntry> entries_;  // [capacity]: entry of handle h at h % capacity
  std::int64_t next_handle_ = 0;
  std::int64_t collectives_ = 0;
  std::map<std::pair<int, bool>, std::int64_t> messages_;  // (peer, receives) -> count
  // Written by the progress thread alone, read by dumps: atomics rather than the mutex, so
  // that each turn of the loop costs two plain stores.
  std::atomic<std::int64_t> last_poll_ns_{0};  // steady clock
  std::atomic<bool> polling_{false};
  std::atomic<std::int64_t> longest_stall_ns_{0};
  std::atomic<double> stall_ended_at_{0};  // wall clock, seconds
};

struct FlightIdentity {
  int world_rank = 0;
  int world_size = 1;
  std::string host;
  // Every world rank's host, when known (MpiRuntime::rank_hosts()): the record names the host
  // of a rank that wrote none itself.
  std::vector<std::string> rank_hosts;
};

class FlightRecorder {
 public:
  // Records go to `directory` (created at the first dump). capacity >= 1.
  FlightRecorder(std::string directory, FlightIdentity identity,
                 std::int64_t capacity = kDefaultFlightRecords);
  // Stops the dump thread and removes the signal handlers it installed.
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  std::shared_ptr<FlightRing> add_ring(std::string group, std::vector<int> members, int rank);

  // Writes the record now, on the calling thread; returns its path ("" when writing failed:
  // a record is a diagnosis aid, its failure must not hide the error being reported).
  std::string dump_now(const std::string& reason) const;

  // Installs the SIGUSR2 and fatal-signal handlers and starts the thread that dumps for them
  // and for stop signals (polled every 50 ms). Call once.
  void watch_signals();

  // Whether any communicator has recorded an operation (a record with none says nothing).
  bool has_operations() const;

  const std::string& directory() const { return directory_; }
  std::string path() const;

 private:
  void dump_loop();

  std::string directory_;
  FlightIdentity identity_;
  std::int64_t capacity_;
  mutable std::mutex rings_mutex_;
  std::vector<std::shared_ptr<FlightRing>> rings_;
  mutable std::mutex dump_mutex_;  // one dump at a time
  int wake_pipe_[2] = {-1, -1};
  bool watching_ = false;
  std::thread dumper_;
};

// "host" of this process (gethostname).
std::string flight_host_name();

// A test seam for what the flight recorder diagnoses: on world rank `world_rank`, the
// collective number `seq` of the group named `group` is
//   skip    not issued at all (its Work is complete at once; the next collective takes its
//           number), as a rank whose code path forgot one;
//   shrink  an all_reduce of the first half of its buffer only, as a rank that disagrees on a
//           size.
struct CommFault {
  enum class Kind { skip, shrink };
  Kind kind = Kind::skip;
  int world_rank = 0;
  std::string group;
  std::int64_t seq = 0;
};

// OASES_TEST_COMM_FAULT=<skip|shrink>:<world rank>:<group>:<seq>; nullopt when unset. A
// malformed value is a UserError naming the variable and the form.
std::optional<CommFault> comm_fault_from_environment();

}  // namespace oases::comm
