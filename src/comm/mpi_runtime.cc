#include "comm/mpi_runtime.h"

#include "core/error.h"

#include <fmt/format.h>
#include <mpi.h>
#if OASES_HAVE_PMIX
#include <pmix.h>
#endif
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

namespace oases::comm {
namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

bool has_env(const char* name) { return std::getenv(name) != nullptr; }

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// The first of `names` that is set and holds a non-negative integer.
std::optional<int> env_int(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const std::string value = env_or_empty(name);
    if (value.empty()) continue;
    try {
      std::size_t used = 0;
      const int parsed = std::stoi(value, &used);
      if (used == value.size() && parsed >= 0) return parsed;
    } catch (const std::exception&) {
    }
  }
  return std::nullopt;
}

// What the launcher says about this process, read before MPI_Init (MPI cannot tell yet).
struct LaunchIdentity {
  int rank = -1, size = -1;
  // How many ranks share this host, when the launcher says.
  std::optional<int> ranks_on_this_host;
};

LaunchIdentity launch_identity() {
  LaunchIdentity id;
  id.rank = env_int({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK",
                     "SLURM_PROCID"})
                .value_or(-1);
  id.size = env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS"})
                .value_or(-1);
  id.ranks_on_this_host =
      env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE"});
  return id;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

// "1, 3-5, 7": ranks listed compactly.
std::string format_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? fmt::format("{}", ranks[i])
                  : fmt::format("{}{}{}", ranks[i], j == i + 1 ? ", " : "-", ranks[j]);
    i = j + 1;
  }
  return out;
}

std::filesystem::path marker_path(const std::filesystem::path& dir, int rank) {
  return dir / fmt::format("rank-{}", rank);
}

// The state of a process on this host, from /proc: "stopped", "exited" or empty (running or
// unknown).
std::string process_state(long pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  if (!stat) return "exited";
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return "";
  const char state = line[close + 2];
  if (state == 'T' || state == 't') return "stopped (SIGSTOP or a debugger)";
  if (state == 'Z' || state == 'X') return "exited";
  return "";
}

// The host the launcher placed each of `ranks` on, asked of its PMIx server (which knows the
// whole job's map before any rank starts); empty when no PMIx launcher started this process,
// oases was built without PMIx, or the server cannot name one of them.
//
// Called by the start-up watchdog while MPI_Init may be inside PMIx on another thread: PMIx
// counts its initialisations, so this one joins Open MPI's (or is joined by it), and lookups
// are served by PMIx's own progress thread. It is never finalised: the caller ends the
// process right after.
std::vector<std::string> launcher_hosts(const std::vector<int>& ranks) {
#if OASES_HAVE_PMIX
  if (!has_env("PMIX_NAMESPACE") || ranks.empty()) return {};
  pmix_proc_t self{};
  if (PMIx_Init(&self, nullptr, 0) != PMIX_SUCCESS) return {};
  // Only what the local server already holds (the job map), and never a long wait: the
  // watchdog must end the process whatever PMIx does.
  pmix_info_t lookup[2]{};
  const bool local_only = true;
  const int timeout_seconds = 2;
  PMIx_Info_load(&lookup[0], PMIX_OPTIONAL, &local_only, PMIX_BOOL);
  PMIx_Info_load(&lookup[1], PMIX_TIMEOUT, &timeout_seconds, PMIX_INT);
  std::vector<std::string> hosts;
  for (int rank : ranks) {
    pmix_proc_t proc{};
    std::memcpy(proc.nspace, self.nspace, sizeof(proc.nspace));
    proc.rank = static_cast<pmix_rank_t>(rank);
    pmix_value_t* value = nullptr;
    std::string host;
    if (PMIx_Get(&proc, PMIX_HOSTNAME, lookup, 2, &value) == PMIX_SUCCESS && value != nullptr) {
      if (value->type == PMIX_STRING && value->data.string != nullptr) host = value->data.string;
      PMIx_Value_destruct(value);
      std::free(value);
    }
    if (host.empty()) return {};
    hosts.push_back(std::move(host));
  }
  return hosts;
#else
  (void)ranks;
  return {};
#endif
}

// Each host of `hosts` with its ranks of `ranks` (one host per rank, in the same order), hosts
// in the order of their first rank.
std::vector<std::pair<std::string, std::vector<int>>> group_by_host(
    const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  std::vector<std::pair<std::string, std::vector<int>>> by_host;
  std::map<std::string, std::size_t> index_of_host;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const auto [it, added] = index_of_host.emplace(hosts[i], by_host.size());
    if (added) by_host.push_back({hosts[i], {}});
    by_host[it->second].second.push_back(ranks[i]);
  }
  return by_host;
}

// "on host b", "on hosts b (ranks 2, 3) and c (rank 4)": where `ranks` sit, given `hosts` (one
// per rank, in the same order).
std::string describe_hosts_of(const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  const auto by_host = group_by_host(ranks, hosts);
  if (by_host.size() == 1) return "on host " + by_host.front().first;
  std::string out = "on hosts ";
  for (std::size_t h = 0; h < by_host.size(); ++h) {
    const auto& [host, host_ranks] = by_host[h];
    out += fmt::format("{}{} (rank{} {})", h == 0 ? "" : h + 1 == by_host.size() ? " and " : ", ",
                       host, host_ranks.size() == 1 ? "" : "s", format_ranks(host_ranks));
  }
  return out;
}

// What the markers of this job say about ranks that have not finished start-up.
std::string describe_missing_ranks(const std::filesystem::path& dir, const LaunchIdentity& id) {
  if (dir.empty() || id.size <= 0)
    return "the launcher gives no job id, so the ranks that did not start cannot be named";
  const std::string this_host = host_name();
  std::vector<int> never_started;
  std::vector<std::string> notes;
  for (int rank = 0; rank < id.size; ++rank) {
    std::ifstream marker(marker_path(dir, rank));
    std::string host;
    long pid = 0;
    if (!(marker >> host >> pid)) {
      never_started.push_back(rank);
      continue;
    }
    if (host != this_host) continue;
    if (const std::string state = process_state(pid); !state.empty())
      notes.push_back(fmt::format("rank {} (pid {}) is {}", rank, pid, state));
  }
  std::string out;
  const bool whole_job_here = id.ranks_on_this_host && *id.ranks_on_this_host == id.size;
  if (!never_started.empty()) {
    out = fmt::format("rank{} {} did not start", never_started.size() == 1 ? "" : "s",
                      format_ranks(never_started));
    if (!whole_job_here) {
      const std::vector<std::string> hosts = launcher_hosts(never_started);
      out += fmt::format(" ({}no marker in {}; ranks on other hosts leave theirs on their own "
                         "host, so those there may have started unless the folder is shared)",
                         hosts.empty() ? "" : describe_hosts_of(never_started, hosts) + "; ",
                         dir.string());
    }
  } else {
    out = fmt::format("all {} ranks started but MPI start-up did not finish on every one", id.size);
  }
  for (const auto& note : notes) out += "; " + note;
  return out;
}

// A flight record without operations whose reason is the start-up timeout's message (the line
// as printed, without "error: " and the newline), when the run keeps flight records.
void leave_startup_flight_record(const std::string& flight_dir, int rank, int size,
                                 std::string message) {
  if (flight_dir.empty() || rank < 0) return;
  if (message.rfind("error: ", 0) == 0) message.erase(0, 7);
  while (!message.empty() && message.back() == '\n') message.pop_back();
  FlightRecorder(flight_dir, FlightIdentity{rank, std::max(size, rank + 1), host_name(), {}})
      .dump_now("start-up timeout: " + message);
}

// Waits on its own thread while MPI_Init runs; if the deadline passes first, it reports the
// ranks that did not start and ends this process (no MPI call can be made yet).
class InitWatchdog {
 public:
  InitWatchdog(std::chrono::steady_clock::time_point deadline, double timeout_seconds,
               std::filesystem::path marker_dir, LaunchIdentity id, std::string flight_dir)
      : thread_([=, this] {
          std::unique_lock lock(mutex_);
          if (done_changed_.wait_until(lock, deadline, [this] { return done_; })) return;
          const std::string message = fmt::format(
              "error: rank {} of {}: the job did not start within parallel.startup_timeout_s = "
              "{} s (waiting in MPI_Init for every rank): {}. Look for a stopped, crashed or "
              "overloaded rank; raise parallel.startup_timeout_s if start-up is slow, or set it "
              "to 0 to wait forever\n",
              id.rank, id.size, timeout_seconds, describe_missing_ranks(marker_dir, id));
          std::fputs(message.c_str(), stderr);
          std::fflush(stderr);
          leave_startup_flight_record(flight_dir, id.rank, id.size, message);
          // The marker stays: the watchdogs of the other ranks that did start fire a moment
          // later and must not count this one among those that never came. The folder is
          // named after the job, so what a failed start leaves in the temporary folder is
          // one small folder per failed job.
          // A non-zero exit makes the launcher end the other ranks.
          _exit(3);
        }) {}

  ~InitWatchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_changed_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_changed_;
  bool done_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

// Every rank sends rank 0 one byte and waits for its reply, polling until `deadline`. Rank 0
// names the ranks it did not hear from; the others give rank 0 a few seconds longer, so that
// its more precise report ends the job first.
void check_in_with_rank_zero(int rank, int size, std::chrono::steady_clock::time_point deadline,
                             double timeout_seconds, const std::string& flight_dir) {
  constexpr int kStartupTag = 0x5a7e;
  using namespace std::chrono_literals;
  const auto poll_until = [](std::vector<MPI_Request>& requests,
                             std::chrono::steady_clock::time_point until) {
    while (true) {
      int all_done = 0;
      MPI_Testall(static_cast<int>(requests.size()), requests.data(), &all_done,
                  MPI_STATUSES_IGNORE);
      if (all_done) return true;
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(1ms);
    }
  };
  char byte = 1;
  if (rank == 0) {
    std::vector<char> received(static_cast<std::size_t>(size), 0);
    std::vector<MPI_Request> requests(static_cast<std::size_t>(size - 1));
    for (int peer = 1; peer < size; ++peer)
      MPI_Irecv(&received[static_cast<std::size_t>(peer)], 1, MPI_CHAR, peer, kStartupTag,
                MPI_COMM_WORLD, &requests[static_cast<std::size_t>(peer - 1)]);
    if (!poll_until(requests, deadline)) {
      std::vector<int> missing;
      for (int peer = 1; peer < size; ++peer) {
        int done = 0;
        MPI_Test(&requests[static_cast<std::size_t>(peer - 1)], &done, MPI_STATUS_IGNORE);
        if (!done) missing.push_back(peer);
      }
      const std::string message = fmt::format(
          "error: rank 0 of {}: rank{} {} did not check in within parallel.startup_timeout_s = "
          "{} s after MPI start-up; look for a stopped, crashed or overloaded rank, or raise the "
          "timeout\n",
          size, missing.size() == 1 ? "" : "s", format_ranks(missing), timeout_seconds);
      std::fputs(message.c_str(), stderr);
      std::fflush(stderr);
      leave_startup_flight_record(flight_dir, rank, size, message);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    for (int peer = 1; peer < size; ++peer)
      MPI_Send(&byte, 1, MPI_CHAR, peer, kStartupTag, MPI_COMM_WORLD);
    return;
  }
  char reply = 0;
  std::vector<MPI_Request> requests(2);
  MPI_Isend(&byte, 1, MPI_CHAR, 0, kStartupTag, MPI_COMM_WORLD, &requests[0]);
  MPI_Irecv(&reply, 1, MPI_CHAR, 0, kStartupTag, MPI_COMM_WORLD, &requests[1]);
  if (!poll_until(requests, deadline + 5s)) {
    const std::string message = fmt::format(
        "error: rank {} of {}: rank 0 did not confirm start-up within "
        "parallel.startup_timeout_s = {} s; look for a stopped, crashed or overloaded rank 0\n",
        rank, size, timeout_seconds);
    std::fputs(message.c_str(), stderr);
    std::fflush(stderr);
    leave_startup_flight_record(flight_dir, rank, size, message);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
}

// Leaves this rank's start-up marker for the life of start-up, then removes it (and the
// directory, once the last rank has removed its own).
class StartupMarker {
 public:
  StartupMarker(std::filesystem::path dir, int rank) : dir_(std::move(dir)), rank_(rank) {
    if (dir_.empty() || rank_ < 0) return;
    std::error_code error;
    std::filesystem::create_directories(dir_, error);
    std::ofstream marker(marker_path(dir_, rank_));
    marker << host_name() << ' ' << static_cast<long>(getpid()) << '\n';
  }
  ~StartupMarker() {
    if (dir_.empty() || rank_ < 0) return;
    std::error_code ignored;
    std::filesystem::remove(marker_path(dir_, rank_), ignored);
    std::filesystem::remove(dir_, ignored);  // fails harmlessly while other markers remain
  }
  StartupMarker(const StartupMarker&) = delete;
  StartupMarker& operator=(const StartupMarker&) = delete;

 private:
  std::filesystem::path dir_;
  int rank_;
};

// This process's affinity mask; every core when it cannot be read.
cpu_set_t affinity_mask() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < std::max(1L, cores) && c < CPU_SETSIZE; ++c) CPU_SET(c, &mask);
  }
  return mask;
}

// One rank's placement as it travels in a collective (plain bytes).
struct PlacementRecord {
  int ranks_on_host;
  int cores_on_host;
  int cores_of_rank;
  char host[64];
};

struct Placements {
  HostPlacement mine, most_crowded;
  std::vector<std::string> rank_hosts;  // per world rank
};

// This rank's placement, the most crowded host's and every rank's host (collective over
// MPI_COMM_WORLD).
Placements find_placements(int world_size) {
  MPI_Comm host_comm = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host_comm);
  int ranks_on_host = 1;
  MPI_Comm_size(host_comm, &ranks_on_host);
  const cpu_set_t mine = affinity_mask();
  std::vector<cpu_set_t> masks(static_cast<std::size_t>(ranks_on_host));
  MPI_Allgather(&mine, sizeof(cpu_set_t), MPI_BYTE, masks.data(), sizeof(cpu_set_t), MPI_BYTE,
                host_comm);
  MPI_Comm_free(&host_comm);
  cpu_set_t all;
  CPU_ZERO(&all);
  for (cpu_set_t& mask : masks) CPU_OR(&all, &all, &mask);

  HostPlacement placement;
  placement.host = host_name();
  placement.ranks_on_host = ranks_on_host;
  placement.cores_on_host = std::max(1, CPU_COUNT(&all));
  placement.cores_of_rank = std::max(1, CPU_COUNT(&mine));

  PlacementRecord record{placement.ranks_on_host, placement.cores_on_host,
                         placement.cores_of_rank, {}};
  std::snprintf(record.host, sizeof(record.host), "%s", placement.host.c_str());
  std::vector<PlacementRecord> records(static_cast<std::size_t>(world_size));
  MPI_Allgather(&record, sizeof(record), MPI_BYTE, records.data(), sizeof(record), MPI_BYTE,
                MPI_COMM_WORLD);
  const PlacementRecord* crowded = &records.front();
  for (const PlacementRecord& r : records)
    // ranks / cores compared without division: a * d > c * b.
    if (static_cast<long>(r.ranks_on_host) * crowded->cores_on_host >
        static_cast<long>(crowded->ranks_on_host) * r.cores_on_host)
      crowded = &r;
  const auto host_of = [](const PlacementRecord& r) {
    return std::string(r.host, strnlen(r.host, sizeof(r.host)));
  };
  HostPlacement most_crowded{host_of(*crowded), crowded->ranks_on_host, crowded->cores_on_host,
                             crowded->cores_of_rank};
  std::vector<std::string> rank_hosts;
  for (const PlacementRecord& r : records) rank_hosts.push_back(host_of(r));
  return {placement, most_crowded, std::move(rank_hosts)};
}

}  // namespace

std::optional<int> launcher_rank() {
  return env_int({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"});
}

std::string describe_rank_hosts(const std::vector<std::string>& rank_hosts) {
  std::vector<int> ranks(rank_hosts.size());
  for (std::size_t r = 0; r < ranks.size(); ++r) ranks[r] = static_cast<int>(r);
  const auto by_host = group_by_host(ranks, rank_hosts);
  std::string out = fmt::format("{} rank{} on {} host{}:", ranks.size(), ranks.size() == 1 ? "" : "s",
                                by_host.size(), by_host.size() == 1 ? "" : "s");
  for (std::size_t h = 0; h < by_host.size(); ++h) {
    const auto& [host, on_host] = by_host[h];
    out += fmt::format("{} {} (rank{} {})", h == 0 ? "" : ",", host, on_host.size() == 1 ? "" : "s",
                       format_ranks(on_host));
  }
  return out;
}

HostPlacement this_process_placement() {
  const cpu_set_t mine = affinity_mask();
  const int cores = std::max(1, CPU_COUNT(&mine));
  return HostPlacement{host_name(), 1, cores, cores};
}

std::string startup_marker_directory() {
  std::string job = env_or_empty("PMIX_NAMESPACE");
  if (job.empty()) job = env_or_empty("OMPI_MCA_ess_base_jobid");
  if (job.empty() && has_env("SLURM_JOB_ID"))
    job = env_or_empty("SLURM_JOB_ID") + "." + env_or_empty("SLURM_STEP_ID");
  if (job.empty()) return "";
  for (char& c : job)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  std::error_code error;
  const auto temp = std::filesystem::temp_directory_path(error);
  return ((error ? std::filesystem::path("/tmp") : temp) / ("oases-startup-" + job)).string();
}

bool launched_by_mpi() {
  return has_env("OMPI_COMM_WORLD_SIZE") || has_env("PMI_SIZE") || has_env("PMI_RANK") ||
         has_env("PMIX_RANK") || has_env("MV2_COMM_WORLD_SIZE");
}

MpiRuntime::MpiRuntime(double startup_timeout_seconds, std::string flight_directory) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  OASES_ASSERT(!initialized && !finalized,
               "MPI was already {} in this process; create one MpiRuntime, once",
               finalized ? "finalised" : "initialised");

  // Overwrite = 0: a user who sets the parameter (environment, or mpirun --mca, which
  // arrives through the environment) keeps the value they chose.
  setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);

  OASES_CHECK(startup_timeout_seconds >= 0,
              "parallel.startup_timeout_s = {} must be >= 0 seconds (0: no timeout)",
              startup_timeout_seconds);
  const bool timed = startup_timeout_seconds > 0;
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(timed ? startup_timeout_seconds : 0));
  const LaunchIdentity id = launch_identity();
  const std::string marker_dir = timed ? startup_marker_directory() : "";
  StartupMarker marker(marker_dir, id.rank);

  int provided = MPI_THREAD_SINGLE;
  {
    std::optional<InitWatchdog> watchdog;
    if (timed) watchdog.emplace(deadline, startup_timeout_seconds, marker_dir, id, flight_directory);
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    OASES_FAIL(
        "the MPI library provides {} but oases needs MPI_THREAD_MULTIPLE (each "
        "communicator has its own progress thread); use an MPI built with full thread "
        "support (OpenMPI: configure --enable-mpi-thread-multiple, the default since 3.0)",
        thread_level_name(provided));
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  if (timed && world_size_ > 1)
    check_in_with_rank_zero(world_rank_, world_size_, deadline, startup_timeout_seconds,
                            flight_directory);
  Placements placements = find_placements(world_size_);
  placement_ = std::move(placements.mine);
  most_crowded_ = std::move(placements.most_crowded);
  rank_hosts_ = std::move(placements.rank_hosts);
}

MpiRuntime::~MpiRuntime() { MPI_Finalize(); }

}  // namespace oases::comm
