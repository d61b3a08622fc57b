#include "data/mlm.h"

#include "core/error.h"
#include "core/philox.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace oases::data {
namespace {

constexpr std::int64_t kVocab = 50000;
constexpr std::uint64_t kSeed = 1234;

// Window tokens [rows, seq_len - 2] in [0, kVocab): a deterministic pattern.
std::vector<std::int32_t> text_tokens(std::int64_t rows, std::int64_t seq_len,
                                      std::int64_t first_sample = 0) {
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(rows * (seq_len - 2)));
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto global = static_cast<std::uint64_t>(first_sample * (seq_len - 2)) + i;
    tokens[i] = static_cast<std::int32_t>((global * 2654435761u) % kVocab);
  }
  return tokens;
}

struct Masked {
  std::vector<std::int32_t> inputs, targets;
};

Masked mask(const std::vector<std::int32_t>& tokens, std::int64_t rows, std::int64_t seq_len,
            std::uint64_t stream, std::int64_t first_sample, std::uint64_t seed = kSeed) {
  Masked m{std::vector<std::int32_t>(static_cast<std::size_t>(rows * seq_len), -7),
           std::vector<std::int32_t>(static_cast<std::size_t>(rows * seq_len), -7)};
  mlm_mask(tokens.data(), rows, seq_len, kVocab, seed, stream, first_sample, m.inputs.data(),
           m.targets.data());
  return m;
}

std::int64_t selected(const Masked& m) {
  std::int64_t count = 0;
  for (std::int32_t t : m.targets) count += t != -1;
  return count;
}

TEST(Mlm, SpecialTokensFollowTheTokenizerVocabulary) {
  const MlmSpecialTokens s = mlm_special_tokens(100);
  EXPECT_EQ(s.mask, 100);
  EXPECT_EQ(s.cls, 101);
  EXPECT_EQ(s.sep, 102);
  EXPECT_EQ(s.pad, 103);
}

// CLS and SEP frame every row and are never selected; unselected text positions keep their
// token with target -1; selected ones carry the original token as target and one of [MASK],
// a token id of the tokenizer, or the original as input.
TEST(Mlm, RowsAreFramedAndOnlyTextPositionsAreSelected) {
  const std::int64_t rows = 40, seq_len = 33;
  const auto tokens = text_tokens(rows, seq_len);
  const Masked m = mask(tokens, rows, seq_len, 5, 0);
  const MlmSpecialTokens special = mlm_special_tokens(kVocab);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t* in = &m.inputs[static_cast<std::size_t>(r * seq_len)];
    const std::int32_t* target = &m.targets[static_cast<std::size_t>(r * seq_len)];
    EXPECT_EQ(in[0], special.cls);
    EXPECT_EQ(in[seq_len - 1], special.sep);
    EXPECT_EQ(target[0], -1);
    EXPECT_EQ(target[seq_len - 1], -1);
    for (std::int64_t p = 1; p < seq_len - 1; ++p) {
      const std::int32_t token = tokens[static_cast<std::size_t>(r * (seq_len - 2) + p - 1)];
      if (target[p] == -1) {
        ASSERT_EQ(in[p], token) << r << "," << p;
      } else {
        ASSERT_EQ(target[p], token) << r << "," << p;
        ASSERT_TRUE(in[p] == special.mask || (in[p] >= 0 && in[p] < kVocab)) << in[p];
      }
    }
  }
  EXPECT_GT(selected(m), 0);
}

// The header's description of the bits, implemented here independently, gives the same rows.
TEST(Mlm, DrawsAreTheDocumentedPhiloxBits) {
  const std::int64_t rows = 30, seq_len = 20, first = 77;
  const std::uint64_t stream = 0x123456789ull;
  const auto tokens = text_tokens(rows, seq_len);
  const Masked m = mask(tokens, rows, seq_len, stream, first);
  const PhiloxKey key = philox_key(kSeed, fnv1a64("data.mlm"));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t p = 1; p < seq_len - 1; ++p) {
      const auto k = static_cast<std::size_t>(r * seq_len + p);
      const std::int32_t token = tokens[static_cast<std::size_t>(r * (seq_len - 2) + p - 1)];
      const PhiloxCounter bits =
          philox4x32({static_cast<std::uint32_t>(p), static_cast<std::uint32_t>(first + r),
                      static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                     key);
      const bool is_selected = bits[0] < 644245094u;
      ASSERT_EQ(m.targets[k], is_selected ? token : -1) << r << "," << p;
      if (!is_selected) continue;
      std::int32_t expected = token;
      if (bits[1] < 3435973836u) {
        expected = static_cast<std::int32_t>(kVocab);  // [MASK]
      } else if (bits[1] < 3865470566u) {
        expected = static_cast<std::int32_t>((std::uint64_t{bits[2]} * kVocab) >> 32);
      }
      ASSERT_EQ(m.inputs[k], expected) << r << "," << p;
    }
  }
}

// A global sample's row is the same whichever call (rank, micro-batch) produces it.
TEST(Mlm, RowsDoNotDependOnHowTheBatchIsSplit) {
  const std::int64_t rows = 12, seq_len = 25, first = 100;
  const auto tokens = text_tokens(rows, seq_len, first);
  const Masked whole = mask(tokens, rows, seq_len, 9, first);
  Masked pieces{std::vector<std::int32_t>(whole.inputs.size()),
                std::vector<std::int32_t>(whole.inputs.size())};
  const std::int64_t text_len = seq_len - 2;
  std::int64_t total = 0;
  for (const auto& [begin, end] : {std::pair{0, 3}, std::pair{3, 10}, std::pair{10, 12}}) {
    mlm_mask(tokens.data() + begin * text_len, end - begin, seq_len, kVocab, kSeed, 9,
             first + begin, pieces.inputs.data() + begin * seq_len,
             pieces.targets.data() + begin * seq_len);
    total += mlm_selected_count(end - begin, seq_len, kSeed, 9, first + begin);
  }
  EXPECT_EQ(pieces.inputs, whole.inputs);
  EXPECT_EQ(pieces.targets, whole.targets);
  EXPECT_EQ(total, selected(whole));
}

// Over 2000 x 128 text positions: the selection rate is 0.15 and the selected positions split
// 80/10/10, each within 5 binomial standard deviations; the random replacements are spread
// over the whole tokenizer vocabulary (10 equal bins, each within 5 deviations).
TEST(Mlm, RatesMatchBert) {
  const std::int64_t rows = 2000, seq_len = 130;
  const auto tokens = text_tokens(rows, seq_len);
  const Masked m = mask(tokens, rows, seq_len, 3, 0);
  const MlmSpecialTokens special = mlm_special_tokens(kVocab);
  std::int64_t masked = 0, replaced = 0, kept = 0;
  std::vector<std::int64_t> bins(10, 0);
  for (std::size_t k = 0; k < m.targets.size(); ++k) {
    if (m.targets[k] == -1) continue;
    if (m.inputs[k] == special.mask) {
      ++masked;
    } else if (m.inputs[k] == m.targets[k]) {
      ++kept;  // (a random replacement equal to the original, 1 in 50000, lands here too)
    } else {
      ++replaced;
      ++bins[static_cast<std::size_t>(m.inputs[k] * 10 / kVocab)];
    }
  }
  auto expect_binomial = [](const char* what, std::int64_t count, std::int64_t n, double p) {
    const double mean = static_cast<double>(n) * p;
    const double sd = std::sqrt(mean * (1 - p));
    EXPECT_NEAR(static_cast<double>(count), mean, 5 * sd) << what << " of " << n;
  };
  const std::int64_t positions = rows * (seq_len - 2);
  const std::int64_t chosen = masked + replaced + kept;
  expect_binomial("selected", chosen, positions, 0.15);
  expect_binomial("masked", masked, chosen, 0.8);
  expect_binomial("replaced", replaced, chosen, 0.1);
  expect_binomial("kept", kept, chosen, 0.1);
  for (std::size_t b = 0; b < bins.size(); ++b) expect_binomial("bin", bins[b], replaced, 0.1);
  EXPECT_EQ(mlm_selected_count(rows, seq_len, kSeed, 3, 0), chosen);
}

TEST(Mlm, StreamAndSeedChangeTheMask) {
  const std::int64_t rows = 8, seq_len = 64;
  const auto tokens = text_tokens(rows, seq_len);
  const Masked base = mask(tokens, rows, seq_len, 1, 0);
  EXPECT_NE(mask(tokens, rows, seq_len, 2, 0).targets, base.targets);
  EXPECT_NE(mask(tokens, rows, seq_len, 1 + (std::uint64_t{1} << 32), 0).targets, base.targets);
  EXPECT_NE(mask(tokens, rows, seq_len, 1, 0, kSeed + 1).targets, base.targets);
  EXPECT_EQ(mask(tokens, rows, seq_len, 1, 0).inputs, base.inputs);  // and is reproducible
}

TEST(Mlm, ResultDoesNotDependOnThreadCount) {
  const std::int64_t rows = 300, seq_len = 100;
  const auto tokens = text_tokens(rows, seq_len);
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    Masked m = mask(tokens, rows, seq_len, 4, 10);
    const std::int64_t count = mlm_selected_count(rows, seq_len, kSeed, 4, 10);
    omp_set_num_threads(saved);
    m.targets.push_back(static_cast<std::int32_t>(count));
    return m;
  };
  const Masked one = run(1), three = run(3);
  EXPECT_EQ(one.inputs, three.inputs);
  EXPECT_EQ(one.targets, three.targets);
}

TEST(Mlm, RowsWithoutTextOnlyHoldClsAndSep) {
  const std::vector<std::int32_t> none;
  std::vector<std::int32_t> inputs(6), targets(6);
  mlm_mask(none.data(), 3, 2, kVocab, kSeed, 0, 0, inputs.data(), targets.data());
  const MlmSpecialTokens special = mlm_special_tokens(kVocab);
  EXPECT_EQ(inputs, (std::vector<std::int32_t>{special.cls, special.sep, special.cls, special.sep,
                                               special.cls, special.sep}));
  EXPECT_EQ(targets, std::vector<std::int32_t>(6, -1));
  EXPECT_EQ(mlm_selected_count(3, 2, kSeed, 0, 0), 0);
}

TEST(Mlm, TokenOutsideTheTokenizerVocabularyIsAUserError) {
  std::vector<std::int32_t> tokens = text_tokens(2, 6);
  tokens[5] = static_cast<std::int32_t>(kVocab);  // the [MASK] id is not a text token
  std::vector<std::int32_t> inputs(12), targets(12);
  EXPECT_THROW(mlm_mask(tokens.data(), 2, 6, kVocab, kSeed, 0, 0, inputs.data(), targets.data()),
               UserError);
}

}  // namespace
}  // namespace oases::data
