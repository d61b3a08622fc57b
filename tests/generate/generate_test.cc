#include "generate/generate.h"

#include "core/error.h"
#include "kernels/kernels.h"
#include "generate/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace oases::generate {
namespace {

plan::RunConfig model_config(const std::string& arch, const std::string& precision) {
  plan::RunConfig c;
  c.model.arch = model::parse_architecture(arch);
  c.model.layers = 2;
  c.model.hidden = arch == "llama" ? 36 : 30;
  c.model.heads = arch == "llama" ? 6 : 3;
  c.model.kv_heads = arch == "llama" ? 2 : 0;
  c.model.ffn_hidden = 37;
  c.model.vocab_size = 256;  // the byte tokenizer
  c.model.seq_len = 11;
  c.train.precision = precision;
  c.train.micro_batch = 1;
  c.train.global_batch = 1;
  return c;
}

std::vector<std::string> samples(train::TrainingEngine& engine, GenerateOptions o, bool kv_cache) {
  o.kv_cache = kv_cache;
  const auto tokenizer = data::make_tokenizer("byte");
  return generate(engine, *tokenizer, o).samples;
}

// The cache changes how the logits are computed, not which tokens are chosen: greedy and
// seeded sampling, across several window slides (30 tokens at seq_len 11) with both the
// default and the full-window policy, in fp64.
TEST(Generate, CacheChoosesTheSameTokensAsFullRecomputation) {
  for (const std::string arch : {"gpt", "llama"}) {
    train::TrainingEngine engine(model_config(arch, "fp64"));
    kernels::scale(engine.model().params(), 20.0);  // peaky distributions: varied text
    for (const double temperature : {0.0, 1.0}) {
      for (const std::int64_t keep : {0, 11, 1}) {
        GenerateOptions o;
        o.prompt = "Once";
        o.max_new_tokens = 30;
        o.sampling = {temperature, 0, 0.97};
        o.num_samples = 2;
        o.seed = 5;
        o.slide_keep = keep;
        const auto cached = samples(engine, o, true);
        const auto full = samples(engine, o, false);
        ASSERT_EQ(cached.size(), 2u);
        EXPECT_EQ(cached, full) << arch << " temperature " << temperature << " keep " << keep;
        EXPECT_EQ(cached[0].size(), 4u + 30u);
        EXPECT_EQ(cached[0].rfind("Once", 0), 0u);
        if (temperature > 0) {
          EXPECT_NE(cached[0], cached[1]) << "samples share their draws";
        }
      }
    }
  }
}

// Sample s draws with counter (position, s): the first sample of a run of three is the sample
// of a run of one.
TEST(Generate, SampleDoesNotDependOnHowManyRun) {
  train::TrainingEngine engine(model_config("gpt", "fp64"));
  kernels::scale(engine.model().params(), 20.0);
  GenerateOptions o;
  o.prompt = "x";
  o.max_new_tokens = 12;
  o.sampling = {1.0, 0, 1.0};
  o.seed = 9;
  const auto one = samples(engine, o, true);
  o.num_samples = 3;
  const auto three = samples(engine, o, true);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[0], one[0]);
}

TEST(Generate, EmptyPromptStartsAfterEndOfDocument) {
  train::TrainingEngine engine(model_config("llama", "fp64"));
  GenerateOptions o;
  o.max_new_tokens = 7;
  o.sampling.temperature = 0;
  const auto from_empty = samples(engine, o, true);
  ASSERT_EQ(from_empty.size(), 1u);
  EXPECT_EQ(from_empty[0].size(), 7u);  // the end-of-document token is not shown
  o.prompt = "\n";
  const auto from_newline = samples(engine, o, true);
  EXPECT_EQ("\n" + from_empty[0], from_newline[0]);
}

TEST(Generate, StopStringEndsTheSampleBeforeIt) {
  train::TrainingEngine engine(model_config("gpt", "fp64"));
  kernels::scale(engine.model().params(), 20.0);
  GenerateOptions o;
  o.prompt = "ab";
  o.max_new_tokens = 20;
  o.sampling = {1.0, 0, 1.0};
  o.seed = 2;
  const std::string whole = samples(engine, o, true)[0];
  const std::string continuation = whole.substr(2);
  const std::string stop = continuation.substr(6, 2);
  o.stops = {"never appears \x01", stop};
  const std::string cut = samples(engine, o, true)[0];
  EXPECT_EQ(cut, "ab" + continuation.substr(0, continuation.find(stop)));
}

// Hand-made distribution: probabilities 0.5, 0.3, 0.15, 0.05 on tokens 2, 0, 3, 1.
const std::vector<double> kLogits = {std::log(0.3), std::log(0.05), std::log(0.5), std::log(0.15)};

std::vector<std::int32_t> tokens_of(std::span<const Candidate> candidates) {
  std::vector<std::int32_t> tokens;
  for (const Candidate& c : candidates) tokens.push_back(c.token);
  return tokens;
}

TEST(TokenSampler, TopPKeepsTheSmallestNucleus) {
  using Tokens = std::vector<std::int32_t>;
  const auto nucleus = [](double top_p, std::int64_t top_k = 0) {
    TokenSampler sampler({1.0, top_k, top_p}, 4);
    return tokens_of(sampler.candidates(kLogits));
  };
  EXPECT_EQ(nucleus(1.0), (Tokens{2, 0, 3, 1}));
  EXPECT_EQ(nucleus(0.99), (Tokens{2, 0, 3, 1}));
  EXPECT_EQ(nucleus(0.9), (Tokens{2, 0, 3}));   // 0.8 < 0.9 <= 0.95
  EXPECT_EQ(nucleus(0.7), (Tokens{2, 0}));      // 0.5 < 0.7 <= 0.8
  EXPECT_EQ(nucleus(0.45), (Tokens{2}));
  EXPECT_EQ(nucleus(1e-9), (Tokens{2}));        // never empty
  // Top-k first, then the nucleus of what is left, renormalised: 0.5 / 0.8 = 0.625.
  EXPECT_EQ(nucleus(0.9, 2), (Tokens{2, 0}));
  EXPECT_EQ(nucleus(0.7, 2), (Tokens{2, 0}));
  EXPECT_EQ(nucleus(0.6, 2), (Tokens{2}));
}

// Draws over an even grid of uniforms land only in the nucleus, in proportion to the
// renormalised probabilities (0.5 / 0.8 and 0.3 / 0.8 at top_p 0.7).
TEST(TokenSampler, DrawsFollowTheRenormalisedNucleus) {
  TokenSampler sampler({1.0, 0, 0.7}, 4);
  std::vector<int> counts(4, 0);
  const int draws = 8000;
  for (int i = 0; i < draws; ++i) ++counts[static_cast<std::size_t>(sampler.sample(kLogits, (i + 0.5) / draws))];
  EXPECT_EQ(counts[1], 0);
  EXPECT_EQ(counts[3], 0);
  EXPECT_NEAR(counts[2], draws * 0.625, 1);
  EXPECT_NEAR(counts[0], draws * 0.375, 1);
}

TEST(TokenSampler, GreedyTakesTheLikeliestLowestIdOnTies) {
  TokenSampler sampler({0.0, 40, 1.0}, 4);
  EXPECT_EQ(sampler.sample(kLogits, 0.99), 2);
  const std::vector<double> tie = {1.0, 3.0, 3.0, 0.0};
  EXPECT_EQ(sampler.sample(tie, 0.99), 1);
}

void expect_user_error(const GenerateOptions& o, const std::vector<std::string>& fragments) {
  try {
    validate(o);
    FAIL() << "accepted";
  } catch (const UserError& e) {
    for (const std::string& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "expected '" << f << "' in: " << e.what();
  }
}

TEST(Generate, BadOptionsNameTheFlagTheValueAndWhatIsValid) {
  GenerateOptions o;
  o.sampling.top_p = 0;
  expect_user_error(o, {"--top-p = 0", "(0, 1]"});
  o.sampling.top_p = 1.5;
  expect_user_error(o, {"--top-p = 1.5", "(0, 1]"});
  o.sampling.top_p = std::nan("");
  expect_user_error(o, {"--top-p = nan", "(0, 1]"});
  o = {};
  o.num_samples = 0;
  expect_user_error(o, {"--num-samples = 0", ">= 1"});
  o = {};
  o.sampling.temperature = -1;
  expect_user_error(o, {"--temperature = -1", ">= 0"});
  o = {};
  o.stops = {""};
  expect_user_error(o, {"--stop", "empty"});
  o = {};
  o.slide_keep = -2;
  expect_user_error(o, {"--slide-keep = -2", ">= 0"});
}

TEST(Generate, SlideKeepBeyondTheWindowIsAnError) {
  train::TrainingEngine engine(model_config("gpt", "fp64"));
  GenerateOptions o;
  o.prompt = "a";
  o.slide_keep = 12;
  const auto tokenizer = data::make_tokenizer("byte");
  try {
    generate(engine, *tokenizer, o);
    FAIL() << "accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--slide-keep = 12 must be at most model.seq_len = 11"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace oases::generate
