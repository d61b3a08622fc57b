// Stop signals: the first is remembered and the process goes on; a second ends the process at
// once with 128 + its number; an ignored signal stays ignored; the previous actions come back.
#include "core/stop_signals.h"

#include <gtest/gtest.h>

#include <csignal>

namespace oases {
namespace {

TEST(StopSignals, TheFirstIsRememberedAndTheProcessGoesOn) {
  StopSignals signals({SIGTERM, SIGUSR1});
  EXPECT_EQ(signals.received(), 0);
  ASSERT_EQ(raise(SIGUSR1), 0);
  EXPECT_EQ(signals.received(), SIGUSR1);
  EXPECT_EQ(signal_name(signals.received()), "SIGUSR1");
}

TEST(StopSignalsDeathTest, ASecondEndsTheProcessAtOnceWith128PlusItsNumber) {
  EXPECT_EXIT(
      {
        StopSignals signals({SIGTERM, SIGINT});
        raise(SIGINT);
        raise(SIGTERM);
        std::exit(0);  // not reached
      },
      ::testing::ExitedWithCode(128 + SIGTERM), "");
}

TEST(StopSignals, AnIgnoredSignalStaysIgnoredAndActionsAreRestored) {
  struct sigaction ignore{};
  ignore.sa_handler = SIG_IGN;
  struct sigaction before{};
  ASSERT_EQ(sigaction(SIGHUP, &ignore, &before), 0);
  {
    StopSignals signals({SIGHUP, SIGUSR1});
    raise(SIGHUP);  // as under nohup: nothing happens
    EXPECT_EQ(signals.received(), 0);
  }
  struct sigaction now{};
  sigaction(SIGHUP, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
  sigaction(SIGUSR1, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
  sigaction(SIGHUP, &before, nullptr);
}

TEST(StopSignals, OnlyOneSetIsInstalledAtATime) {
  StopSignals signals({SIGUSR1});
  EXPECT_THROW(StopSignals({SIGTERM}), InternalError);
}

}  // namespace
}  // namespace oases
