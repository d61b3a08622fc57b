// Streams and Events on the CPU, in both modes: work runs in enqueue order; an immediate stream
// runs it at once on the caller, an asynchronous one on its worker while the host goes on;
// make_wait orders one stream after a point of another without blocking the host; events
// report completion and carry the time their stream reached them; a failure on an
// asynchronous stream surfaces at the next synchronize, skips the stream's later work, and
// travels to the streams that wait on it; the destructor drains.
//
// The tests that cross threads share plain variables between streams on purpose: only the
// events order them, so a missing happens-before shows up under ThreadSanitizer.
#include "core/device.h"

#include "core/error.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <future>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace oases {

// Parameterised tests are named after the mode ("Streams.X/asynchronous").
void PrintTo(StreamMode mode, std::ostream* out) { *out << stream_mode_name(mode); }

namespace {

using namespace std::chrono_literals;

class Streams : public ::testing::TestWithParam<StreamMode> {
 protected:
  StreamMode mode() const { return GetParam(); }
  bool asynchronous() const { return mode() == StreamMode::asynchronous; }
};

INSTANTIATE_TEST_SUITE_P(BothModes, Streams,
                         ::testing::Values(StreamMode::immediate, StreamMode::asynchronous));

TEST_P(Streams, RunWorkInEnqueueOrder) {
  Stream stream(Device::cpu(), mode());
  EXPECT_EQ(stream.mode(), mode());
  std::vector<int> order;
  for (int i = 0; i < 1000; ++i) stream.enqueue([&order, i] { order.push_back(i); });
  stream.synchronize();
  EXPECT_TRUE(stream.query());
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST(Stream, ImmediateRunsWorkAtOnceOnTheCaller) {
  Stream stream;
  EXPECT_EQ(stream.mode(), StreamMode::immediate);
  std::thread::id ran_on;
  stream.enqueue([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());  // before any synchronize
  Event event;
  event.record(stream);
  EXPECT_TRUE(event.query());
  EXPECT_LE(event.time(), Event::Clock::now());
}

TEST(Stream, AsynchronousRunsWorkOnItsWorkerWhileTheHostGoesOn) {
  Stream stream(Device::cpu(), StreamMode::asynchronous);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::thread::id ran_on;
  stream.enqueue([released] { released.wait(); });
  stream.enqueue([&] { ran_on = std::this_thread::get_id(); });
  Event after;
  after.record(stream);
  // The host got here while the stream's first work still blocks.
  EXPECT_FALSE(stream.query());
  EXPECT_FALSE(after.query());
  release.set_value();
  after.synchronize();
  EXPECT_TRUE(after.query());
  stream.synchronize();
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

// `producer` writes a value after a delay; `consumer` reads it after waiting for the event
// recorded behind the write. The host is not held up by make_wait.
TEST_P(Streams, MakeWaitOrdersAnotherStreamAfterThePoint) {
  Stream producer(Device::cpu(), mode()), consumer(Device::cpu(), mode());
  int value = 0;
  int seen = -1;
  producer.enqueue([&value] {
    std::this_thread::sleep_for(20ms);
    value = 42;
  });
  Event written;
  written.record(producer);
  const auto before = Event::Clock::now();
  written.make_wait(consumer);
  consumer.enqueue([&] { seen = value; });
  if (asynchronous()) {
    EXPECT_LT(Event::Clock::now() - before, 15ms);  // the host did not wait
  }
  consumer.synchronize();
  EXPECT_EQ(seen, 42);
  producer.synchronize();
}

// A wait made on an immediate stream, the caller, blocks it until an asynchronous stream has
// reached the point.
TEST(Stream, AnImmediateStreamWaitsForAnAsynchronousOneOnTheCaller) {
  Stream worker(Device::cpu(), StreamMode::asynchronous);
  Stream caller;
  int value = 0;
  worker.enqueue([&value] {
    std::this_thread::sleep_for(10ms);
    value = 7;
  });
  Event written;
  written.record(worker);
  written.make_wait(caller);
  EXPECT_TRUE(written.query());
  EXPECT_EQ(value, 7);
}

// Recording an event again marks a new point; a wait made before keeps the old one.
TEST(Stream, RecordingAgainLeavesEarlierWaitsOnTheOldPoint) {
  Stream producer(Device::cpu(), StreamMode::asynchronous);
  Stream consumer(Device::cpu(), StreamMode::asynchronous);
  std::promise<void> first, second;
  std::shared_future<void> first_done = first.get_future().share();
  std::shared_future<void> second_done = second.get_future().share();
  Event point;
  producer.enqueue([first_done] { first_done.wait(); });
  point.record(producer);
  point.make_wait(consumer);
  std::promise<void> consumer_ran;
  std::future<void> consumer_done = consumer_ran.get_future();
  consumer.enqueue([&consumer_ran] { consumer_ran.set_value(); });
  producer.enqueue([second_done] { second_done.wait(); });
  point.record(producer);
  first.set_value();
  // The consumer runs although the producer still blocks before the new point.
  EXPECT_EQ(consumer_done.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(point.query());
  second.set_value();
  point.synchronize();
  producer.synchronize();
  consumer.synchronize();
}

TEST_P(Streams, EventsTimeTheWorkBetweenThem) {
  Stream stream(Device::cpu(), mode());
  Event start, end;
  start.record(stream);
  stream.enqueue([] { std::this_thread::sleep_for(30ms); });
  end.record(stream);
  stream.synchronize();
  ASSERT_TRUE(start.query() && end.query());
  EXPECT_GE(elapsed_seconds(start, end), 0.03);
  EXPECT_LT(elapsed_seconds(start, end), 10.0);
  EXPECT_LE(elapsed_seconds(end, start), -0.03);
}

// An event's time is when the stream reached it, not when the host recorded it.
TEST(Stream, AnEventCarriesTheTimeItsStreamReachedIt) {
  Stream stream(Device::cpu(), StreamMode::asynchronous);
  stream.enqueue([] { std::this_thread::sleep_for(30ms); });
  Event reached;
  reached.record(stream);
  const Event::Clock::time_point recorded = Event::Clock::now();
  reached.synchronize();
  EXPECT_GE(reached.time() - recorded, 20ms);
}

TEST(Stream, AnEventNeverRecordedIsReachedAndHasNoTime) {
  Stream stream(Device::cpu(), StreamMode::asynchronous);
  const Event never;
  EXPECT_FALSE(never.recorded());
  EXPECT_TRUE(never.query());
  never.synchronize();
  never.make_wait(stream);  // nothing to wait for
  stream.synchronize();
  EXPECT_THROW(never.time(), InternalError);
}

TEST(Stream, ImmediateWorkThrowsToItsCaller) {
  Stream stream;
  EXPECT_THROW(stream.enqueue([] { throw std::runtime_error("boom"); }), std::runtime_error);
  stream.synchronize();  // nothing kept
}

// The failure is rethrown by the next synchronize, the work after it is skipped, the events
// after it are still reached, and once rethrown the stream runs work again.
TEST(Stream, AnAsynchronousFailureSurfacesAtTheNextSynchronize) {
  Stream stream(Device::cpu(), StreamMode::asynchronous);
  bool skipped_ran = false, later_ran = false;
  stream.enqueue([] { throw std::runtime_error("boom"); });
  stream.enqueue([&] { skipped_ran = true; });
  Event after;
  after.record(stream);
  after.synchronize();  // reached, although the stream failed
  try {
    stream.synchronize();
    ADD_FAILURE() << "synchronize() did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom");
  }
  EXPECT_FALSE(skipped_ran);
  stream.enqueue([&] { later_ran = true; });
  stream.synchronize();  // the failure was reported once
  EXPECT_TRUE(later_ran);
}

// A stream that waits on an event reached after a failure fails with it too.
TEST(Stream, AFailureTravelsToTheStreamsThatWait) {
  Stream failing(Device::cpu(), StreamMode::asynchronous);
  Stream waiting(Device::cpu(), StreamMode::asynchronous);
  Stream caller;
  bool dependent_ran = false;
  failing.enqueue([] { throw std::runtime_error("upstream"); });
  Event point;
  point.record(failing);
  point.make_wait(waiting);
  waiting.enqueue([&] { dependent_ran = true; });
  EXPECT_THROW(waiting.synchronize(), std::runtime_error);
  EXPECT_FALSE(dependent_ran);
  EXPECT_THROW(point.make_wait(caller), std::runtime_error);  // an immediate stream: at once
  EXPECT_THROW(failing.synchronize(), std::runtime_error);
}

TEST(Stream, TheDestructorDrainsTheQueue) {
  int ran = 0;
  {
    Stream stream(Device::cpu(), StreamMode::asynchronous);
    for (int i = 0; i < 50; ++i)
      stream.enqueue([&ran] {
        std::this_thread::sleep_for(100us);
        ++ran;
      });
  }
  EXPECT_EQ(ran, 50);
}

TEST(Stream, AFailureNeverSynchronizedIsLoggedWhenTheStreamGoes) {
  ::testing::internal::CaptureStderr();
  {
    Stream stream(Device::cpu(), StreamMode::asynchronous);
    stream.enqueue([] { throw std::runtime_error("lost failure"); });
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("lost failure"), std::string::npos) << log;
}

// The OpenMP thread limit is a per-thread setting; work runs under its enqueuing thread's.
TEST_P(Streams, WorkRunsUnderTheOpenMpLimitOfItsEnqueuingThread) {
  const int initial = omp_get_max_threads();
  Stream stream(Device::cpu(), mode());
  int first = 0, second = 0;
  omp_set_num_threads(1);
  stream.enqueue([&first] { first = omp_get_max_threads(); });
  omp_set_num_threads(3);
  stream.enqueue([&second] { second = omp_get_max_threads(); });
  omp_set_num_threads(initial);
  stream.synchronize();
  EXPECT_EQ(first, 1);
  EXPECT_EQ(second, 3);
}

// Work on one stream may enqueue onto another; what it wrote is visible to that work.
TEST(Stream, WorkMayEnqueueOntoAnotherStream) {
  Stream first(Device::cpu(), StreamMode::asynchronous);
  Stream second(Device::cpu(), StreamMode::asynchronous);
  int value = 0, seen = 0;
  first.enqueue([&] {
    value = 5;
    second.enqueue([&] { seen = value; });
  });
  first.synchronize();
  second.synchronize();
  EXPECT_EQ(seen, 5);
}

}  // namespace
}  // namespace oases
