// `oases flight`'s reading of a job's records, on records built here: a rank behind, sizes or
// issuers that differ, a rank without a record, a late rank, a message never sent, ranks that
// wait for each other, a healthy snapshot, and unreadable folders.
#include "report/flight_report.h"
#include "core/error.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

namespace oases::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kNow = 1'800'000'000.0;  // the records' wall clock

json op(std::int64_t seq, const std::string& kind, const std::string& state, double waited = 0,
        std::int64_t bytes = 4096, const std::string& issuer = "F(attention.5, mb=1, sb=0)",
        double reached = kNow - 20) {
  json o{{"seq", seq},         {"kind", kind},       {"elements", bytes / 8}, {"bytes", bytes},
         {"dtype", "f64"},     {"issuer", issuer},   {"state", state},        {"issued_at", reached}};
  if (state != "issued") o["started_at"] = reached;
  if (state == "finished") o["finished_at"] = reached + 0.01;
  else o["waited_s"] = waited;
  return o;
}

json group(const std::string& name, std::vector<int> members, int rank, std::int64_t issued,
           json ops, json messages = json::array()) {
  return {{"group", name}, {"members", members}, {"rank", rank}, {"collectives_issued", issued},
          {"messages", messages}, {"operations", ops}};
}

json record(int rank, int world, const std::string& host, json groups,
            const std::string& reason = "collective timeout: test") {
  return {{"format", "oases-flight-1"}, {"rank", rank}, {"world_size", world}, {"host", host},
          {"pid", 100 + rank}, {"reason", reason}, {"written_at", kNow}, {"groups", groups}};
}

FlightRecords records_of(std::vector<json> ranks) {
  FlightRecords r;
  r.directory = "run/flight";
  for (const auto& j : ranks) r.world_size = std::max(r.world_size, j["world_size"].get<int>());
  r.ranks = std::move(ranks);
  return r;
}

std::string all_findings(const FlightDiagnosis& d) {
  std::string text;
  for (const auto& f : d.findings) text += f + "\n";
  return text;
}

TEST(FlightReport, NamesTheRankThatNeverStartedACollectiveAndWhoWaitsInIt) {
  // tp [2,3]: rank 2 waits in #418 for 15 s; rank 3 issued only 417 (and waits in nothing).
  const auto d = diagnose_flight(records_of({
      record(2, 4, "a", json::array({group("tp", {2, 3}, 0, 418,
                                           json::array({op(417, "all_reduce", "finished"),
                                                        op(418, "all_reduce", "started", 15.0)}))})),
      record(3, 4, "b", json::array({group("tp", {2, 3}, 1, 417,
                                           json::array({op(417, "all_reduce", "finished")}))}),
             "stop signal SIGTERM"),
  }));
  ASSERT_FALSE(d.findings.empty());
  EXPECT_EQ(d.findings.front(),
            "rank 3 (host b) never started all_reduce #418 of tp group [2,3] "
            "(F(attention.5, mb=1, sb=0)); rank 2 (host a) waits in it for 15.0 s");
  EXPECT_EQ(d.findings.size(), 1u) << all_findings(d);
}

TEST(FlightReport, TheRankBehindComesFirstWhenOthersWaitBehindItsVictims) {
  // Rank 3 is behind in tp [2,3]; ranks 0 and 1 wait for rank 2 in the world group, and rank 2
  // waits for rank 3. The headline is rank 3, who waits for nobody.
  const auto world_waiting = [](int rank, std::int64_t issued) {
    return group("world", {0, 1, 2, 3}, rank, issued,
                 json::array({op(issued, "all_reduce", issued == 12 ? "started" : "finished", 14.0,
                                 8, "stop agreement (end of step)")}));
  };
  const auto d = diagnose_flight(records_of({
      record(0, 4, "a", json::array({world_waiting(0, 12)})),
      record(1, 4, "a", json::array({world_waiting(1, 12)})),
      record(2, 4, "a", json::array({world_waiting(2, 11),
                                     group("tp", {2, 3}, 0, 418,
                                           json::array({op(418, "all_reduce", "started", 15.0)}))})),
      record(3, 4, "b", json::array({world_waiting(3, 11),
                                     group("tp", {2, 3}, 1, 417,
                                           json::array({op(417, "all_reduce", "finished")}))})),
  }));
  ASSERT_GE(d.findings.size(), 2u);
  EXPECT_NE(d.findings[0].find("rank 3 (host b) never started all_reduce #418"), std::string::npos)
      << all_findings(d);
  EXPECT_NE(all_findings(d).find("ranks 2, 3 (hosts a, b) never started all_reduce #12 of world "
                                 "group [0,1,2,3] (stop agreement (end of step)); ranks 0, 1 "
                                 "(host a) wait in it for 14.0 s"),
            std::string::npos)
      << all_findings(d);
}

TEST(FlightReport, SizesThatDifferAreNamedWithEachSide) {
  const auto d = diagnose_flight(records_of({
      record(0, 2, "a", json::array({group("dp", {0, 1}, 0, 7,
                                           json::array({op(6, "all_reduce", "finished"),
                                                        op(7, "all_reduce", "started", 3.0, 4096,
                                                           "ReduceGrads(bucket=0)")}))})),
      record(1, 2, "a", json::array({group("dp", {0, 1}, 1, 7,
                                           json::array({op(6, "all_reduce", "finished"),
                                                        op(7, "all_reduce", "started", 3.0, 2048,
                                                           "ReduceGrads(bucket=0)")}))})),
  }));
  ASSERT_FALSE(d.findings.empty());
  const std::string& first = d.findings.front();
  EXPECT_NE(first.find("disagree on collective #7"), std::string::npos) << first;
  EXPECT_NE(first.find("rank 0 (host a) issued all_reduce of 4096 bytes (512 f64)"),
            std::string::npos) << first;
  EXPECT_NE(first.find("rank 1 (host a) issued all_reduce of 2048 bytes (256 f64)"),
            std::string::npos) << first;
  // The stuck collective itself is told as a consequence, not as a second cause.
  EXPECT_NE(all_findings(d).find("stuck by the disagreement of this group at collective #7"),
            std::string::npos) << all_findings(d);
}

TEST(FlightReport, ASkippedCollectiveShowsAsIssuersThatDiffer) {
  const auto ops = [](const std::string& fifth) {
    return json::array({op(4, "all_reduce", "finished", 0, 4096, "F(mlp.1, mb=0, sb=0)"),
                        op(5, "all_reduce", "finished", 0, 4096, fifth)});
  };
  const auto d = diagnose_flight(records_of({
      record(0, 2, "a", json::array({group("tp", {0, 1}, 0, 5, ops("F(attention.2, mb=0, sb=0)"))})),
      record(1, 2, "a", json::array({group("tp", {0, 1}, 1, 5, ops("F(mlp.2, mb=0, sb=0)"))})),
  }));
  ASSERT_EQ(d.findings.size(), 1u) << all_findings(d);
  EXPECT_NE(d.findings[0].find("disagree on what collective #5"), std::string::npos)
      << d.findings[0];
  EXPECT_NE(d.findings[0].find("rank 0 (host a) for F(attention.2, mb=0, sb=0)"), std::string::npos);
  EXPECT_NE(d.findings[0].find("rank 1 (host a) for F(mlp.2, mb=0, sb=0)"), std::string::npos);
}

TEST(FlightReport, ARankWithoutARecordIsNamedAsTheOneWaitedFor) {
  const auto d = diagnose_flight(records_of({
      record(0, 2, "a", json::array({group("tp", {0, 1}, 0, 9,
                                           json::array({op(9, "all_reduce", "started", 3.0)}))})),
  }));
  EXPECT_EQ(d.notes.front(), "flight records of 1 of 2 ranks in run/flight; none from rank 1");
  ASSERT_EQ(d.findings.size(), 1u);
  EXPECT_NE(d.findings[0].find("rank 1 wrote no flight record"), std::string::npos) << d.findings[0];
  EXPECT_NE(d.findings[0].find("rank 0 (host a) waits for it in all_reduce #9 of tp group [0,1]"),
            std::string::npos) << d.findings[0];
}

TEST(FlightReport, ARankThatReachedACollectiveLongAfterTheOthersIsLate) {
  // Rank 1 was stopped for 20 s, resumed by the launcher's SIGCONT and wrote its record.
  const auto d = diagnose_flight(records_of({
      record(0, 2, "a", json::array({group("tp", {0, 1}, 0, 9,
                                           json::array({op(9, "all_reduce", "started", 20.0, 4096,
                                                           "x", kNow - 20)}))})),
      record(1, 2, "b", json::array({group("tp", {0, 1}, 1, 9,
                                           json::array({op(9, "all_reduce", "started", 0.0, 4096,
                                                           "x", kNow)}))})),
  }));
  ASSERT_EQ(d.findings.size(), 1u) << all_findings(d);
  EXPECT_NE(d.findings[0].find("rank 1 (host b) reached all_reduce #9 of tp group [0,1] (x) 20.0 s "
                               "after the first of its group"),
            std::string::npos) << d.findings[0];
}

TEST(FlightReport, ARankWhoseCommunicationStoodStillIsNamed) {
  // Both started #106 and wait; rank 1's progress thread did not run for 3 s (stopped, then
  // resumed by the launcher to write its record).
  json stalled = group("tp", {0, 1}, 1, 106, json::array({op(106, "all_reduce", "started", 4.0)}));
  stalled["longest_stall_s"] = 3.2;
  const auto d = diagnose_flight(records_of({
      record(0, 2, "a", json::array({group("tp", {0, 1}, 0, 106,
                                           json::array({op(106, "all_reduce", "started", 3.0)}))})),
      record(1, 2, "b", json::array({stalled}), "stop signal SIGTERM"),
  }));
  ASSERT_EQ(d.findings.size(), 1u) << all_findings(d);
  EXPECT_EQ(d.findings[0],
            "rank 1 (host b) did not run for 3.2 s while in all_reduce #106 of tp group [0,1] "
            "(F(attention.5, mb=1, sb=0)) (its communication thread stood still: the process was "
            "stopped or starved of CPU); rank 0 (host a) waits in it for 3.0 s");
}

TEST(FlightReport, AReceiveWaitsForTheSendOfItsNumber) {
  const json recv = op(3, "recv", "started", 8.0, 64, "RecvF(stage=1, mb=2)");
  json recv_with_peer = recv;
  recv_with_peer["peer"] = 0;
  const auto d = diagnose_flight(records_of({
      record(0, 2, "a", json::array({group("pp", {0, 1}, 0, 0, json::array(),
                                           json::array({{{"peer", 1}, {"direction", "send"},
                                                         {"count", 2}}}))})),
      record(1, 2, "b", json::array({group("pp", {0, 1}, 1, 0, json::array({recv_with_peer}),
                                           json::array({{{"peer", 0}, {"direction", "recv"},
                                                         {"count", 3}}}))})),
  }));
  ASSERT_EQ(d.findings.size(), 1u) << all_findings(d);
  EXPECT_EQ(d.findings[0],
            "rank 0 (host a) never sent message #3 to rank 1; rank 1 (host b) waits in recv #3 "
            "from rank 0 on pp group [0,1] (RecvF(stage=1, mb=2)) for 8.0 s");
}

TEST(FlightReport, RanksBehindEachOtherAreACycle) {
  const auto d = diagnose_flight(records_of({
      record(0, 2, "a", json::array({group("tp", {0, 1}, 0, 5, json::array({op(5, "all_reduce", "started", 4.0)})),
                                     group("world", {0, 1}, 0, 1, json::array())})),
      record(1, 2, "a", json::array({group("tp", {0, 1}, 1, 4, json::array()),
                                     group("world", {0, 1}, 1, 2, json::array({op(2, "barrier", "started", 4.0)}))})),
  }));
  EXPECT_NE(all_findings(d).find("ranks 0, 1 (host a) wait for each other"), std::string::npos)
      << all_findings(d);
}

TEST(FlightReport, AHealthySnapshotHasNoFinding) {
  // SIGUSR2 on a running job: operations in flight for milliseconds, ranks a little apart.
  const FlightRecords snapshot = records_of({
      record(0, 2, "a", json::array({group("tp", {0, 1}, 0, 41,
                                           json::array({op(40, "all_reduce", "finished"),
                                                        op(41, "all_reduce", "started", 0.002)}))}),
             "SIGUSR2"),
      record(1, 2, "a", json::array({group("tp", {0, 1}, 1, 40,
                                           json::array({op(40, "all_reduce", "finished")}))}),
             "SIGUSR2"),
  });
  const auto d = diagnose_flight(snapshot);
  EXPECT_TRUE(d.findings.empty()) << all_findings(d);
  EXPECT_NE(format_flight_diagnosis(d).find("no rank waits for another"), std::string::npos);
  // Without the threshold, the 2 ms wait counts.
  const auto strict = diagnose_flight(snapshot, 0.0);
  ASSERT_EQ(strict.findings.size(), 1u);
  EXPECT_NE(strict.findings[0].find("rank 1 (host a) never started all_reduce #41"),
            std::string::npos) << strict.findings[0];
}

TEST(FlightReport, FoldersWithoutRecordsAndBrokenRecordsAreClearErrors) {
  const fs::path dir = testing::fresh_test_folder("flight_report");
  try {
    read_flight_records(dir.string());
    ADD_FAILURE() << "an empty folder was read";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no flight record"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("kill -USR2"), std::string::npos) << e.what();
  }
  fs::create_directories(dir / "flight");
  std::ofstream(dir / "flight" / "rank_0.json") << "{\"format\": \"oases-flight-1\", \"rank\": 0";
  try {
    read_flight_records(dir.string());
    ADD_FAILURE() << "a truncated record was read";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_0.json is not a readable flight record"),
              std::string::npos) << e.what();
  }
  std::ofstream(dir / "flight" / "rank_0.json")
      << record(0, 1, "a", json::array({group("tp", {0}, 0, 0, json::array())})).dump();
  const FlightRecords records = read_flight_records(dir.string());  // the run folder
  EXPECT_EQ(records.ranks.size(), 1u);
  EXPECT_EQ(read_flight_records((dir / "flight").string()).world_size, 1);  // or the folder
  EXPECT_THROW(read_flight_records((dir / "missing").string()), UserError);
}

}  // namespace
}  // namespace oases::report
