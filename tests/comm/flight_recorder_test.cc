// The flight recorder's rings and records, in one process: numbering per group and per peer,
// the ring's overwriting, states and waits, the record file, SIGUSR2 and the test seam's
// parsing. The MPI communicator's use of it is tested in mpi_communicator_mpitest.cc and by
// whole jobs in tests/mpi/flight_runs_test.cc.
#include "comm/flight_recorder.h"
#include "core/error.h"
#include "support/runs.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

namespace oases::comm {
namespace {

namespace fs = std::filesystem;

FlightOperation collective(const char* kind, std::int64_t elements, std::string issuer = "") {
  FlightOperation op;
  op.kind = kind;
  op.elements = elements;
  op.bytes = elements * 4;
  op.dtype = "f32";
  op.issuer = std::move(issuer);
  return op;
}

FlightOperation message(const char* kind, int peer, int tag) {
  FlightOperation op = collective(kind, 8);
  op.point_to_point = true;
  op.receives = std::string(kind) == "recv";
  op.peer = peer;
  op.tag = tag;
  return op;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  nlohmann::json j;
  in >> j;
  return j;
}

TEST(FlightRing, NumbersCollectivesPerGroupAndMessagesPerPeerAndDirection) {
  FlightRing ring("pp", {4, 6}, 0, 100);
  ring.issued(collective("all_reduce", 10));
  ring.issued(message("send", 1, 3));
  ring.issued(message("send", 1, 3));
  ring.issued(message("recv", 1, 3));
  ring.issued(collective("broadcast", 1));
  const nlohmann::json j = ring.to_json(std::chrono::steady_clock::now());
  EXPECT_EQ(j["group"], "pp");
  EXPECT_EQ(j["members"], nlohmann::json({4, 6}));
  EXPECT_EQ(j["collectives_issued"], 2);
  const auto& ops = j["operations"];
  ASSERT_EQ(ops.size(), 5u);
  EXPECT_EQ(ops[0]["seq"], 1);
  EXPECT_EQ(ops[1]["seq"], 1);  // first send to peer 1
  EXPECT_EQ(ops[2]["seq"], 2);  // second send to peer 1
  EXPECT_EQ(ops[3]["seq"], 1);  // first recv from peer 1
  EXPECT_EQ(ops[4]["seq"], 2);  // second collective
  EXPECT_EQ(ops[1]["peer"], 1);
  EXPECT_EQ(ops[1]["tag"], 3);
  EXPECT_FALSE(ops[0].contains("peer"));
  const auto& messages = j["messages"];
  ASSERT_EQ(messages.size(), 2u);
  for (const auto& m : messages)
    EXPECT_EQ(m["count"], m["direction"] == "send" ? 2 : 1) << m.dump();
}

TEST(FlightRing, KeepsTheLastCapacityOperationsOldestFirst) {
  FlightRing ring("tp", {0, 1}, 1, 3);
  std::vector<std::int64_t> handles;
  for (int i = 0; i < 5; ++i) handles.push_back(ring.issued(collective("all_reduce", i + 1)));
  // Handles of overwritten entries are ignored, not applied to their successors.
  ring.started(handles[0]);
  ring.finished(handles[1]);
  const auto ops = ring.to_json(std::chrono::steady_clock::now())["operations"];
  ASSERT_EQ(ops.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ops[i]["seq"], static_cast<int>(i) + 3);
    EXPECT_EQ(ops[i]["elements"], static_cast<int>(i) + 3);
    EXPECT_EQ(ops[i]["state"], "issued");
  }
}

TEST(FlightRing, StatesTimesAndTheWaitOfUnfinishedOperations) {
  FlightRing ring("dp", {0, 1}, 0, 10);
  const auto done = ring.issued(collective("all_reduce", 4, "ReduceGrads(bucket=0)"));
  const auto waiting = ring.issued(collective("all_gather", 4, "F(attention.1)"));
  const auto queued = ring.issued(collective("all_reduce", 4));
  ring.started(done);
  ring.finished(done);
  ring.started(waiting);
  const auto later = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  const auto ops = ring.to_json(later)["operations"];
  EXPECT_EQ(ops[0]["state"], "finished");
  EXPECT_EQ(ops[0]["issuer"], "ReduceGrads(bucket=0)");
  EXPECT_TRUE(ops[0].contains("finished_at"));
  EXPECT_FALSE(ops[0].contains("waited_s"));
  EXPECT_LE(ops[0]["issued_at"].get<double>(), ops[0]["started_at"].get<double>());
  EXPECT_LE(ops[0]["started_at"].get<double>(), ops[0]["finished_at"].get<double>());
  EXPECT_EQ(ops[1]["state"], "started");
  EXPECT_GE(ops[1]["waited_s"].get<double>(), 5.0);
  EXPECT_LT(ops[1]["waited_s"].get<double>(), 6.0);
  EXPECT_EQ(ops[2]["state"], "issued");
  EXPECT_FALSE(ops[2].contains("started_at"));
  (void)queued;
}

TEST(FlightRing, AGapBetweenPollsIsAStallButAWaitForWorkIsNot) {
  using namespace std::chrono_literals;
  FlightRing ring("tp", {0, 1}, 0, 4);
  ring.polled(false);  // nothing in flight: the loop sleeps until work comes
  std::this_thread::sleep_for(600ms);
  ring.polled(true);
  EXPECT_EQ(ring.to_json(std::chrono::steady_clock::now())["longest_stall_s"], 0.0);
  std::this_thread::sleep_for(600ms);  // polling, yet no turn: the thread did not run
  ring.polled(true);
  const auto j = ring.to_json(std::chrono::steady_clock::now());
  EXPECT_GE(j["longest_stall_s"].get<double>(), 0.6);
  EXPECT_LT(j["longest_stall_s"].get<double>(), 5.0);
  EXPECT_TRUE(j.contains("stall_ended_at"));
  // A stall still going on when the record is written counts up to then.
  const auto later = std::chrono::steady_clock::now() + 3s;
  EXPECT_GE(ring.to_json(later)["longest_stall_s"].get<double>(), 3.0);
}

TEST(FlightRecorder, WritesOneRecordPerRankWithEveryRing) {
  const fs::path dir = testing::fresh_test_folder("flight_recorder_dump") / "flight";
  FlightRecorder recorder(dir.string(), {3, 4, "host-b", {}}, 50);
  EXPECT_FALSE(recorder.has_operations());
  auto tp = recorder.add_ring("tp", {2, 3}, 1);
  auto world = recorder.add_ring("world", {0, 1, 2, 3}, 3);
  tp->issued(collective("all_reduce", 16, "F(mlp.0)"));
  EXPECT_TRUE(recorder.has_operations());
  const std::string path = recorder.dump_now("collective timeout: test");
  EXPECT_EQ(path, (dir / "rank_3.json").string());
  const nlohmann::json j = read_json(path);
  EXPECT_EQ(j["format"], "oases-flight-1");
  EXPECT_EQ(j["rank"], 3);
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["host"], "host-b");
  EXPECT_EQ(j["reason"], "collective timeout: test");
  ASSERT_EQ(j["groups"].size(), 2u);
  EXPECT_EQ(j["groups"][0]["group"], "tp");
  EXPECT_EQ(j["groups"][0]["operations"].size(), 1u);
  EXPECT_EQ(j["groups"][1]["operations"].size(), 0u);
  // A later record replaces the earlier one, whole; nothing else is left in the folder.
  world->issued(collective("barrier", 0));
  recorder.dump_now("again");
  EXPECT_EQ(read_json(path)["reason"], "again");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

TEST(FlightRecorder, AnUnwritableFolderIsReportedNotThrown) {
  const fs::path dir = testing::fresh_test_folder("flight_recorder_unwritable");
  std::ofstream(dir / "file") << "x";
  FlightRecorder recorder((dir / "file" / "flight").string(), {0, 1, "h", {}}, 4);
  EXPECT_EQ(recorder.dump_now("test"), "");
}

TEST(FlightRecorder, Usr2WritesTheRecordAndTheProcessGoesOn) {
  const fs::path dir = testing::fresh_test_folder("flight_recorder_usr2") / "flight";
  FlightRecorder recorder(dir.string(), {1, 2, "h", {}}, 8);
  recorder.add_ring("tp", {0, 1}, 1)->issued(collective("all_reduce", 2));
  recorder.watch_signals();
  ASSERT_EQ(std::raise(SIGUSR2), 0);
  const fs::path path = dir / "rank_1.json";
  for (int i = 0; i < 200 && !fs::exists(path); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(path));
  EXPECT_EQ(read_json(path)["reason"], "SIGUSR2");
}

TEST(FlightRecorder, SignalHandlersAreRestoredWhenItGoes) {
  struct sigaction before{}, after{};
  sigaction(SIGUSR2, nullptr, &before);
  {
    FlightRecorder recorder(testing::fresh_test_folder("flight_recorder_restore").string(),
                            {0, 1, "h", {}}, 2);
    recorder.watch_signals();
    struct sigaction during{};
    sigaction(SIGUSR2, nullptr, &during);
    EXPECT_NE(during.sa_handler, before.sa_handler);
  }
  sigaction(SIGUSR2, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

TEST(FlightRecorderDeathTest, AFatalSignalWritesTheRecordThenEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const fs::path dir = testing::fresh_test_folder("flight_recorder_fatal") / "flight";
  EXPECT_EXIT(
      {
        FlightRecorder recorder(dir.string(), {2, 4, "h", {}}, 8);
        recorder.add_ring("dp", {0, 2}, 1)->issued(collective("all_reduce", 2));
        recorder.watch_signals();
        std::raise(SIGSEGV);
        std::exit(0);  // not reached: the signal's default action ends the process
      },
      ::testing::KilledBySignal(SIGSEGV), "");
  const fs::path path = dir / "rank_2.json";
  ASSERT_TRUE(fs::exists(path));
  EXPECT_EQ(read_json(path)["reason"], "fatal signal SIGSEGV");
}

class FaultVariable : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv("OASES_TEST_COMM_FAULT"); }
};

TEST_F(FaultVariable, ParsesTheFourFieldsAndRefusesAnythingElse) {
  unsetenv("OASES_TEST_COMM_FAULT");
  EXPECT_FALSE(comm_fault_from_environment());
  setenv("OASES_TEST_COMM_FAULT", "shrink:3:tp[2/1]:418", 1);
  const auto fault = comm_fault_from_environment();
  ASSERT_TRUE(fault);
  EXPECT_EQ(fault->kind, CommFault::Kind::shrink);
  EXPECT_EQ(fault->world_rank, 3);
  EXPECT_EQ(fault->group, "tp[2/1]");
  EXPECT_EQ(fault->seq, 418);
  for (const char* bad : {"skip", "skip:1:tp", "drop:1:tp:4", "skip:x:tp:4", "skip:1::4",
                          "skip:1:tp:0", "skip:-1:tp:4", "skip:1:tp:4:5", "skip:1:tp:4x"}) {
    setenv("OASES_TEST_COMM_FAULT", bad, 1);
    try {
      comm_fault_from_environment();
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("OASES_TEST_COMM_FAULT"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace oases::comm
