#include "core/philox.h"

#include <gtest/gtest.h>

#include <cmath>

namespace oases {
namespace {

// Known-answer values from the Random123 distribution (kat_vectors, philox4x32_10).
TEST(Philox, MatchesKnownAnswerVectors) {
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                       {0xffffffffu, 0xffffffffu}),
            (PhiloxCounter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                       {0xa4093822u, 0x299f31d0u}),
            (PhiloxCounter{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, NormalsHaveUnitMomentsAndUniformsStayInRange) {
  const auto key = philox_key(1234, 7);
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const auto block = philox4x32({static_cast<std::uint32_t>(i), 0, 0, 0}, key);
    const double z = normal_from_block(block);
    sum += z;
    sum_sq += z * z;
    const float u = uniform_open0(block[0]);
    ASSERT_GT(u, 0.0f);
    ASSERT_LE(u, 1.0f);
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.01);
}

TEST(Philox, KeysSeparateStreams) {
  EXPECT_NE(philox4x32({1, 2, 3, 4}, philox_key(1, fnv1a64("wte.weight"))),
            philox4x32({1, 2, 3, 4}, philox_key(1, fnv1a64("wpe.weight"))));
  EXPECT_NE(philox_key(1, 5), philox_key(2, 5));
}

}  // namespace
}  // namespace oases
