#include "report/flight_report.h"

#include "core/error.h"
#include "core/regular_file.h"
#include "io/untrusted_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

namespace oases::report {
namespace {

namespace fs = std::filesystem;

struct Op {
  std::int64_t seq = 0;
  std::string kind;
  int peer = -1;
  std::int64_t elements = 0, bytes = 0;
  std::string dtype, issuer, state;
  double issued_at = 0;
  std::optional<double> started_at;
  double waited_s = 0;

  bool point_to_point() const { return kind == "send" || kind == "recv"; }
  bool finished() const { return state == "finished"; }
  // When this rank got to it: started, or issued when it never reached the wire.
  double reached_at() const { return started_at.value_or(issued_at); }
};

struct GroupView {
  std::string name;
  std::vector<int> members;  // world ranks, in group order
  int rank = 0;              // this rank's place in members
  std::int64_t collectives_issued = 0;
  std::map<std::pair<int, std::string>, std::int64_t> messages;  // (peer, direction) -> count
  double longest_stall_s = 0;  // its progress thread did not run for this long
  std::vector<Op> ops;
};

struct RankView {
  int rank = 0;
  std::string host, reason;
  double written_at = 0;
  std::map<std::string, GroupView> groups;  // by group key
};

std::string group_key(const std::string& name, const std::vector<int>& members) {
  return fmt::format("{}|{}", name, fmt::join(members, ","));
}

// "3", "0-2", "0, 2, 5-7"
std::string ranks_text(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    if (j == i) out += std::to_string(ranks[i]);
    else if (j == i + 1) out += fmt::format("{}, {}", ranks[i], ranks[j]);
    else out += fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string seconds_text(double seconds) { return fmt::format("{:.1f} s", seconds); }

std::string clock_text(double unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm parts{};
  gmtime_r(&t, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%H:%M:%S UTC", &parts);
  return text;
}

Op read_op(const nlohmann::json& j) {
  Op op;
  op.seq = j.at("seq").get<std::int64_t>();
  op.kind = j.at("kind").get<std::string>();
  op.peer = j.value("peer", -1);
  op.elements = j.value("elements", std::int64_t{0});
  op.bytes = j.value("bytes", std::int64_t{0});
  op.dtype = j.value("dtype", "");
  op.issuer = j.value("issuer", "");
  op.state = j.at("state").get<std::string>();
  op.issued_at = j.value("issued_at", 0.0);
  if (j.contains("started_at")) op.started_at = j.at("started_at").get<double>();
  op.waited_s = j.value("waited_s", 0.0);
  return op;
}

RankView read_rank(const nlohmann::json& record) {
  RankView view;
  view.rank = record.at("rank").get<int>();
  view.host = record.value("host", "");
  view.reason = record.value("reason", "");
  view.written_at = record.value("written_at", 0.0);
  for (const auto& g : record.at("groups")) {
    GroupView group;
    group.name = g.at("group").get<std::string>();
    group.members = g.at("members").get<std::vector<int>>();
    group.rank = g.at("rank").get<int>();
    group.collectives_issued = g.at("collectives_issued").get<std::int64_t>();
    for (const auto& m : g.value("messages", nlohmann::json::array()))
      group.messages[{m.at("peer").get<int>(), m.at("direction").get<std::string>()}] =
          m.at("count").get<std::int64_t>();
    group.longest_stall_s = g.value("longest_stall_s", 0.0);
    for (const auto& op : g.at("operations")) group.ops.push_back(read_op(op));
    view.groups[group_key(group.name, group.members)] = std::move(group);
  }
  return view;
}

class Diagnoser {
 public:
  Diagnoser(const FlightRecords& records, double min_wait_s)
      : world_size_(records.world_size), min_wait_s_(min_wait_s) {
    for (const auto& record : records.ranks) {
      const auto hosts = record.value("hosts", std::vector<std::string>{});
      for (std::size_t r = 0; r < hosts.size(); ++r) hosts_[static_cast<int>(r)] = hosts[r];
      RankView view = read_rank(record);
      const int rank = view.rank;
      ranks_[rank] = std::move(view);
    }
  }

  FlightDiagnosis run(const std::string& directory) {
    FlightDiagnosis out;
    write_notes(directory, out.notes);
    find_startup_failure(out.findings);
    find_disagreements(out.findings);
    std::vector<std::string> waits = find_waits();
    out.findings.insert(out.findings.end(), waits.begin(), waits.end());
    find_cycles(out.findings);
    return out;
  }

 private:
  // The host of `rank`: its own record's, else what another record says; empty if none does.
  std::string host_of(int rank) const {
    if (const auto it = ranks_.find(rank); it != ranks_.end() && !it->second.host.empty())
      return it->second.host;
    const auto it = hosts_.find(rank);
    return it == hosts_.end() ? "" : it->second;
  }
  std::string who(int rank) const {
    const std::string host = host_of(rank);
    if (host.empty()) return fmt::format("rank {}", rank);
    return fmt::format("rank {} (host {})", rank, host);
  }
  std::string who(const std::vector<int>& ranks) const {
    if (ranks.size() == 1) return who(ranks.front());
    std::set<std::string> hosts;
    for (int r : ranks)
      if (const std::string host = host_of(r); !host.empty()) hosts.insert(host);
    if (hosts.empty()) return fmt::format("ranks {}", ranks_text(ranks));
    return fmt::format("ranks {} (host{} {})", ranks_text(ranks), hosts.size() == 1 ? "" : "s",
                       fmt::join(hosts, ", "));
  }
  static std::string group_text(const GroupView& g) {
    return fmt::format("{} group [{}]", g.name, fmt::join(g.members, ","));
  }
  static std::string issuer_text(const Op& op) {
    return op.issuer.empty() ? "" : fmt::format(" ({})", op.issuer);
  }
  static std::string size_text(const Op& op) {
    if (op.kind == "barrier") return "barrier";
    std::string text = fmt::format("{} of {} bytes ({} {})", op.kind, op.bytes, op.elements, op.dtype);
    if (op.kind == "broadcast" && op.peer >= 0) text += fmt::format(" from group rank {}", op.peer);
    return text;
  }

  void write_notes(const std::string& directory, std::vector<std::string>& notes) const {
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r)
      if (!ranks_.contains(r)) missing.push_back(r);
    notes.push_back(fmt::format("flight records of {} of {} ranks in {}{}", ranks_.size(),
                                world_size_, directory,
                                missing.empty() ? ""
                                                : fmt::format("; none from rank{} {}",
                                                              missing.size() == 1 ? "" : "s",
                                                              ranks_text(missing))));
    // One line per reason, the ranks that gave it together.
    std::map<std::string, std::vector<int>> by_reason;
    for (const auto& [rank, view] : ranks_) by_reason[view.reason].push_back(rank);
    for (const auto& [reason, ranks] : by_reason) {
      double earliest = 1e300;
      for (int r : ranks) earliest = std::min(earliest, ranks_.at(r).written_at);
      notes.push_back(fmt::format("  {} wrote at {}: {}", who(ranks), clock_text(earliest), reason));
    }
  }

  // All members' views of a group that have records, by world rank.
  std::map<int, const GroupView*> views_of(const std::string& key) const {
    std::map<int, const GroupView*> views;
    for (const auto& [rank, view] : ranks_)
      if (auto it = view.groups.find(key); it != view.groups.end()) views[rank] = &it->second;
    return views;
  }

  std::set<std::string> group_keys() const {
    std::set<std::string> keys;
    for (const auto& [rank, view] : ranks_)
      for (const auto& [key, group] : view.groups) keys.insert(key);
    return keys;
  }

  static const Op* collective(const GroupView& g, std::int64_t seq) {
    for (const Op& op : g.ops)
      if (!op.point_to_point() && op.seq == seq) return &op;
    return nullptr;
  }

  // Ranks that gave up waiting for the others at start-up say which ranks (and hosts) never
  // came: their message is the finding.
  void find_startup_failure(std::vector<std::string>& findings) const {
    constexpr std::string_view kStartup = "start-up timeout: ";
    std::map<std::string, std::vector<int>> by_message;
    for (const auto& [rank, view] : ranks_)
      if (view.reason.rfind(kStartup, 0) == 0) {
        // "rank 2 of 4: the job did not start ..." from each rank: one finding per message.
        static const std::regex kRankPrefix(R"(^rank \d+ of \d+: )");
        by_message[std::regex_replace(view.reason.substr(kStartup.size()), kRankPrefix, "")]
            .push_back(rank);
      }
    for (const auto& [message, ranks] : by_message)
      findings.push_back(fmt::format("the job did not start; {} reported: {}", who(ranks), message));
  }

  void find_disagreements(std::vector<std::string>& findings) {
    for (const std::string& key : group_keys()) {
      const auto views = views_of(key);
      if (views.size() < 2) continue;
      std::set<std::int64_t> seqs;
      for (const auto& [rank, g] : views)
        for (const Op& op : g->ops)
          if (!op.point_to_point()) seqs.insert(op.seq);
      for (const std::int64_t seq : seqs) {
        std::map<std::string, std::vector<int>> by_shape, by_issuer;
        std::map<std::string, const Op*> example;
        for (const auto& [rank, g] : views) {
          const Op* op = collective(*g, seq);
          if (op == nullptr) continue;
          const std::string shape = size_text(*op);
          by_shape[shape].push_back(rank);
          by_issuer[op->issuer].push_back(rank);
          example.emplace(shape, op);
          example.emplace("issuer:" + op->issuer, op);
        }
        const GroupView& any = *views.begin()->second;
        if (by_shape.size() > 1) {
          std::vector<std::string> sides;
          for (const auto& [shape, ranks] : by_shape)
            sides.push_back(fmt::format("{} issued {}{}", who(ranks), shape,
                                        issuer_text(*example.at(shape))));
          findings.push_back(fmt::format(
              "the ranks of {} disagree on collective #{}: {}; their sizes or kinds must match",
              group_text(any), seq, fmt::join(sides, "; ")));
          disagreements_[key] = seq;
          break;
        }
        if (by_issuer.size() > 1) {
          std::vector<std::string> sides;
          for (const auto& [issuer, ranks] : by_issuer)
            sides.push_back(fmt::format("{} for {}", who(ranks), issuer.empty() ? "?" : issuer));
          findings.push_back(fmt::format(
              "the ranks of {} disagree on what collective #{} ({}) is for: {}; a rank skipped or "
              "reordered a collective of this group before it",
              group_text(any), seq, by_shape.begin()->first, fmt::join(sides, ", ")));
          disagreements_[key] = seq;
          break;
        }
      }
    }
  }

  struct Wait {
    std::string text;
    double waited = 0;
    std::vector<int> culprits;  // the ranks it names as the cause
    bool others_wait = false;   // ranks other than the culprits wait for them
    bool root = false;          // every culprit waits for nobody itself: look there first
  };

  std::vector<std::string> find_waits() {
    std::vector<Wait> waits;
    // (group key, seq) of collectives already reported, so that its waiters make one line.
    std::set<std::pair<std::string, std::int64_t>> reported;
    for (const auto& [rank, view] : ranks_) {
      for (const auto& [key, g] : view.groups) {
        const Op* oldest = nullptr;
        std::map<std::pair<int, std::string>, const Op*> oldest_message;
        for (const Op& op : g.ops) {
          // A short wait is what a healthy job shows at any moment.
          if (op.finished() || op.waited_s < min_wait_s_) continue;
          if (op.point_to_point()) {
            oldest_message.emplace(std::pair{op.peer, op.kind}, &op);
          } else if (oldest == nullptr) {
            oldest = &op;
          }
        }
        if (oldest != nullptr && reported.insert({key, oldest->seq}).second)
          waits.push_back(collective_wait(key, *oldest));
        for (const auto& [peer_kind, op] : oldest_message)
          if (auto wait = message_wait(rank, g, *op)) waits.push_back(*wait);
      }
    }
    for (Wait& w : waits)
      w.root = !w.culprits.empty() && std::all_of(w.culprits.begin(), w.culprits.end(),
                                                  [&](int c) { return waits_for_nobody(c); });
    std::stable_sort(waits.begin(), waits.end(), [](const Wait& a, const Wait& b) {
      if (a.root != b.root) return a.root;
      if (a.others_wait != b.others_wait) return a.others_wait;
      return a.waited > b.waited;
    });
    std::vector<std::string> out;
    for (const Wait& w : waits) out.push_back(w.text);
    return out;
  }

  // Ranks that `rank` waits for, filled while the waits are read (for roots and cycles).
  std::map<int, std::set<int>> blocked_by_;

  bool waits_for_nobody(int rank) const {
    const auto it = blocked_by_.find(rank);
    return !ranks_.contains(rank) || it == blocked_by_.end() || it->second.empty();
  }

  Wait collective_wait(const std::string& key, const Op& sample) {
    const auto views = views_of(key);
    const GroupView& g = *views.begin()->second;
    const std::int64_t seq = sample.seq;
    std::vector<int> waiters, behind, late, silent;
    double longest = 0, earliest_reach = 1e300;
    std::map<int, double> waited;  // by waiting rank
    for (const auto& [rank, view] : views) {
      const Op* op = collective(*view, seq);
      if (op != nullptr && !op->finished()) {
        waiters.push_back(rank);
        longest = std::max(longest, op->waited_s);
        waited[rank] = op->waited_s;
      }
      if (op != nullptr) earliest_reach = std::min(earliest_reach, op->reached_at());
    }
    double lateness = 0, longest_stall = 0;
    std::vector<int> stalled;
    for (const auto& [rank, view] : views)
      if (view->longest_stall_s >= std::max(1.0, 0.5 * longest)) {
        stalled.push_back(rank);
        longest_stall = std::max(longest_stall, view->longest_stall_s);
      }
    for (const int member : g.members) {
      const auto it = views.find(member);
      if (it == views.end()) {
        silent.push_back(member);
        continue;
      }
      const GroupView& view = *it->second;
      const Op* op = collective(view, seq);
      // Not issued, or issued but still queued behind this group's earlier operations.
      if (view.collectives_issued < seq || (op != nullptr && op->state == "issued")) {
        behind.push_back(member);
        continue;
      }
      // Reached it long after the first member did: stopped (and resumed to write its record),
      // or busy elsewhere for that long.
      if (op != nullptr && op->reached_at() - earliest_reach > std::max(1.0, 0.5 * longest)) {
        late.push_back(member);
        lateness = std::max(lateness, op->reached_at() - earliest_reach);
      }
    }
    const std::string what =
        fmt::format("{} #{} of {}{}", sample.kind, seq, group_text(g), issuer_text(sample));
    const auto waiting = [&](const std::vector<int>& exclude) {
      std::vector<int> w;
      for (int r : waiters)
        if (std::find(exclude.begin(), exclude.end(), r) == exclude.end()) w.push_back(r);
      return w;
    };
    const auto longest_of = [&](const std::vector<int>& ranks) {
      double most = 0;
      for (int r : ranks) most = std::max(most, waited[r]);
      return seconds_text(most);
    };
    Wait wait;
    wait.waited = longest;
    std::vector<int> culprits;
    if (!behind.empty()) {
      culprits = behind;
      const auto w = waiting(behind);
      wait.text = fmt::format("{} never started {}; {} {} in it for {}", who(behind), what,
                              who(w), w.size() == 1 ? "waits" : "wait", longest_of(w));
    } else if (!late.empty()) {
      culprits = late;
      const auto w = waiting(late);
      wait.text = fmt::format(
          "{} reached {} {} after the first of its group (stopped, or busy elsewhere that long); "
          "{} {} in it for {}",
          who(late), what, seconds_text(lateness), who(w), w.size() == 1 ? "waits" : "wait",
          longest_of(w));
    } else if (!silent.empty()) {
      culprits = silent;
      wait.text = fmt::format(
          "{} wrote no flight record (stopped, killed, or hung where it could not write); {} {} "
          "for it in {} for {}",
          who(silent), who(waiters), waiters.size() == 1 ? "waits" : "wait", what,
          seconds_text(longest));
    } else if (const auto d = disagreements_.find(key); d != disagreements_.end() && d->second <= seq) {
      wait.text = fmt::format(
          "{} {} in {} for {}: stuck by the disagreement of this group at collective #{} (the "
          "ranks match different operations from there on)",
          who(waiters), waiters.size() == 1 ? "waits" : "wait", what, seconds_text(longest),
          d->second);
    } else if (waiters.size() < g.members.size()) {
      // The others finished it, so this rank's part was on the wire: its side made no
      // progress since.
      std::vector<int> done;
      for (int m : g.members)
        if (std::find(waiters.begin(), waiters.end(), m) == waiters.end()) done.push_back(m);
      culprits = waiters;
      wait.text = fmt::format(
          "{} {} not finished {}, which {} finished: no progress for {} (the process was "
          "stopped or starved of CPU, or its transport failed)",
          who(waiters), waiters.size() == 1 ? "has" : "have", what, who(done),
          seconds_text(longest));
    } else if (!stalled.empty()) {
      culprits = stalled;
      const auto w = waiting(stalled);
      wait.text = fmt::format(
          "{} did not run for {} while in {} (its communication thread stood still: the process "
          "was stopped or starved of CPU){}",
          who(stalled), seconds_text(longest_stall), what,
          w.empty() ? "" : fmt::format("; {} {} in it for {}", who(w),
                                       w.size() == 1 ? "waits" : "wait", longest_of(w)));
    } else {
      wait.text = fmt::format(
          "every rank of {} started {} #{}{} and none finished it in {}: the network or MPI is "
          "stuck",
          group_text(g), sample.kind, seq, issuer_text(sample), seconds_text(longest));
    }
    for (int r : waiters)
      for (int c : culprits)
        if (c != r) {
          blocked_by_[r].insert(c);
          wait.others_wait = true;
        }
    wait.culprits = std::move(culprits);
    return wait;
  }

  std::optional<Wait> message_wait(int rank, const GroupView& g, const Op& op) {
    if (op.peer < 0 || op.peer >= static_cast<int>(g.members.size())) return std::nullopt;
    const int peer = g.members[static_cast<std::size_t>(op.peer)];
    const bool receives = op.kind == "recv";
    const std::string what = fmt::format("{} #{} {} rank {} on {}{}", op.kind, op.seq,
                                         receives ? "from" : "to", peer, group_text(g),
                                         issuer_text(op));
    Wait wait;
    wait.waited = op.waited_s;
    const auto peer_view = ranks_.find(peer);
    if (peer_view == ranks_.end()) {
      wait.text = fmt::format("{} wrote no flight record; {} waits in {} for {}", who(peer),
                              who(rank), what, seconds_text(op.waited_s));
    } else {
      const auto group = peer_view->second.groups.find(group_key(g.name, g.members));
      std::int64_t matching = 0;
      if (group != peer_view->second.groups.end()) {
        const auto count = group->second.messages.find({g.rank, receives ? "send" : "recv"});
        if (count != group->second.messages.end()) matching = count->second;
      }
      if (matching >= op.seq) return std::nullopt;  // the peer got there: not this one's cause
      wait.text = fmt::format("{} never {} message #{} {} rank {}; {} waits in {} for {}",
                              who(peer), receives ? "sent" : "posted the receive of", op.seq,
                              receives ? "to" : "from", rank, who(rank), what,
                              seconds_text(op.waited_s));
    }
    blocked_by_[rank].insert(peer);
    wait.culprits = {peer};
    wait.others_wait = true;
    return wait;
  }

  void find_cycles(std::vector<std::string>& findings) const {
    // Ranks that reach themselves through "waits for".
    std::set<int> in_cycle;
    for (const auto& [start, next] : blocked_by_) {
      std::set<int> seen;
      std::vector<int> stack(next.begin(), next.end());
      while (!stack.empty()) {
        const int r = stack.back();
        stack.pop_back();
        if (r == start) {
          in_cycle.insert(start);
          break;
        }
        if (!seen.insert(r).second) continue;
        if (auto it = blocked_by_.find(r); it != blocked_by_.end())
          stack.insert(stack.end(), it->second.begin(), it->second.end());
      }
    }
    if (in_cycle.size() >= 2)
      findings.push_back(fmt::format(
          "{} wait for each other: each is behind the other in some group, so they disagree "
          "on the order of their collectives (see the disagreement above, if any)",
          who(std::vector<int>(in_cycle.begin(), in_cycle.end()))));
  }

  int world_size_ = 0;
  double min_wait_s_ = 0;
  std::map<int, RankView> ranks_;
  std::map<int, std::string> hosts_;  // every rank's host, from records that list them
  std::map<std::string, std::int64_t> disagreements_;  // group key -> first collective
};

}  // namespace

FlightRecords read_flight_records(const std::string& path) {
  fs::path dir = path;
  if (fs::is_directory(dir / "flight")) dir /= "flight";
  OASES_CHECK(fs::is_directory(dir),
              "{} is not a folder; give a run folder (with flight/ in it) or its flight folder",
              path);
  FlightRecords records;
  records.directory = dir.string();
  const std::regex name(R"(rank_(\d+)\.json)");
  std::vector<std::pair<int, fs::path>> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch match;
    const std::string file = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(file, match, name))
      files.emplace_back(std::stoi(match[1].str()), entry.path());
  }
  OASES_CHECK(!files.empty(),
              "{} holds no flight record (rank_<R>.json); ranks write theirs when a collective "
              "times out (parallel.comm_timeout_s), on an error or a fatal signal, on a stop "
              "signal, or on `kill -USR2 <pid>`",
              dir.string());
  std::sort(files.begin(), files.end());
  for (const auto& [rank, file] : files) {
    nlohmann::json record;
    try {
      record = io::parse_untrusted_json(
          read_regular_file(file.string(), "flight record", kMaxJsonFileBytes),
          "flight record '" + file.string() + "'");
      OASES_CHECK(record.value("format", "") == "oases-flight-1",
                  "format \"{}\" is not oases-flight-1", record.value("format", ""));
      OASES_CHECK(record.at("rank").get<int>() == rank, "it says rank {}",
                  record.at("rank").get<int>());
      records.world_size = std::max(records.world_size, record.at("world_size").get<int>());
      read_rank(record);  // every field the diagnosis reads is there and typed
      (void)record.value("hosts", std::vector<std::string>{});
    } catch (const std::exception& e) {
      throw UserError(fmt::format("{} is not a readable flight record: {}", file.string(), e.what()));
    }
    records.ranks.push_back(std::move(record));
  }
  return records;
}

FlightDiagnosis diagnose_flight(const FlightRecords& records, double min_wait_s) {
  return Diagnoser(records, min_wait_s).run(records.directory);
}

std::string format_flight_diagnosis(const FlightDiagnosis& diagnosis) {
  std::string out;
  for (const auto& note : diagnosis.notes) out += note + "\n";
  if (diagnosis.findings.empty()) {
    out += "no rank waits for another in these records: nothing was in flight, or everything "
           "in flight was started by every rank it needs\n";
    return out;
  }
  for (const auto& finding : diagnosis.findings) out += "- " + finding + "\n";
  return out;
}

}  // namespace oases::report
