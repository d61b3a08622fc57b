#include "planner/profile.h"

#include "core/error.h"
#include "planner/cost_model.h"
#include "support/errors.h"
#include "support/files.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

namespace oases::planner {
namespace {

Profile sample() {
  Profile p;
  p.model.layers = 4;
  p.model.hidden = 128;
  p.model.heads = 4;
  p.model.ffn_hidden = 512;
  p.model.vocab_size = 257;
  p.model.seq_len = 64;
  p.tp = 2;
  p.micro_batch = 8;
  p.sub_batches = 2;
  for (int k : {1, 2}) {
    DegreeProfile d;
    d.degree = k;
    d.rows = 2 * k;
    d.segments["attention"] = {0.001 * k, 0.0009, 0.002, 0.0003};
    d.segments["mlp"] = {0.0015, 0.0012, 0.003, 0.0004};
    d.collectives["attention.fwd_s"] = 1e-4 * k;
    d.collectives["head.loss-max_s"] = 2e-6;
    d.optimizer_s = 0.01;
    d.parameter_bytes_per_layer = 800000 / k;
    d.parameter_bytes = 5000000 / k;
    d.replica_reduce_per_layer_s = k == 1 ? 0.003 : 0.0;
    d.overlap_slowdown = 0.05 * k;
    d.collective_slowdown = 0.1 * k;
    d.activation_bytes["attention"] = {{"checkpoint", 65536}, {"internals", 100000}, {"core", 0}};
    d.static_activation_bytes = 300000;
    p.degrees.push_back(d);
  }
  p.reshards["1-2"] = 2.5e-4;
  return p;
}

using oases::testing::user_error_of;

TEST(Profile, RoundTripsThroughJson) {
  testing::TempDir dir("profile");
  const Profile p = sample();
  const std::string path = (dir.path() / "p.json").string();
  write_profile(p, path);
  const Profile q = read_profile(path);
  EXPECT_EQ(q.tp, p.tp);
  EXPECT_EQ(q.micro_batch, p.micro_batch);
  EXPECT_EQ(q.sub_batches, p.sub_batches);
  EXPECT_EQ(q.model.hidden, p.model.hidden);
  ASSERT_EQ(q.degrees.size(), p.degrees.size());
  for (std::size_t i = 0; i < p.degrees.size(); ++i) EXPECT_EQ(q.degrees[i], p.degrees[i]);
  EXPECT_EQ(q.reshards, p.reshards);
  EXPECT_DOUBLE_EQ(q.reshard_seconds(2, 1), 2.5e-4);
  EXPECT_EQ(q.reshard_seconds(2, 2), 0.0);
  EXPECT_EQ(to_json(q), to_json(p));
}

// `text` with its first `from` replaced by `to` (a failure when it holds no `from`).
std::string with_first_replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at == std::string::npos) return text;
  return text.replace(at, from.size(), to);
}

TEST(Profile, RoundTripsTheReplicaLinkAndRejectsAMalformedOne) {
  Profile p = sample();
  EXPECT_EQ(to_json(p).find("replica_link"), std::string::npos);  // optional: absent unmeasured
  p.replica_link = {50'384'896, 2, 1.0126};
  const std::string text = to_json(p);
  EXPECT_EQ(profile_from_json(text, "p.json").replica_link, p.replica_link);
  const auto with = [&](const std::string& from, const std::string& to) {
    return with_first_replaced(text, from, to);
  };
  const std::string error = user_error_of(
      [&] { profile_from_json(with("\"ranks\": 2", "\"ranks\": 1"), "p.json"); });
  EXPECT_NE(error.find("p.json: malformed profile (replica_link: 50384896 bytes over 1 ranks in "
                       "1.0126 s: bytes must be > 0, ranks >= 2 and seconds finite and > 0)"),
            std::string::npos)
      << error;
  EXPECT_NE(user_error_of([&] {
              profile_from_json(with("\"seconds\": 1.0126", "\"seconds\": -1"), "p.json");
            }).find("replica_link"),
            std::string::npos);
}

TEST(Profile, RoundTripsTheActivationCodecAndRejectsAMalformedOne) {
  Profile p = sample();
  EXPECT_EQ(to_json(p).find("activation_codec"), std::string::npos);  // optional
  p.activation_codec["bf16"] = {1.5e-9, 1.25e-9};
  p.activation_codec["fp8"] = {4.5e-9, 2.5e-9};
  const std::string text = to_json(p);
  EXPECT_EQ(profile_from_json(text, "p.json").activation_codec, p.activation_codec);
  const auto with = [&](const std::string& from, const std::string& to) {
    return with_first_replaced(text, from, to);
  };
  const std::string negative =
      user_error_of([&] { profile_from_json(with("4.5e-09", "-4.5e-09"), "p.json"); });
  EXPECT_NE(negative.find("p.json: malformed profile (activation_codec \"fp8\": encode -4.5e-09 s "
                          "and decode 2.5e-09 s per element; each must be finite and >= 0)"),
            std::string::npos)
      << negative;
  const std::string word =
      user_error_of([&] { profile_from_json(with("\"fp8\": {", "\"fp4\": {"), "p.json"); });
  EXPECT_NE(word.find("activation_codec \"fp4\": valid: \"bf16\", \"fp8\""), std::string::npos)
      << word;
}

TEST(Profile, RoundTripsTheMemoryRatiosAndTheSettingsTheyWereMeasuredUnder) {
  Profile p = sample();
  // bf16 over fp32 masters, ZeRO-2 at two ranks, AdamW's state offloaded.
  p.param_bytes_ratio = 1.5;
  p.grad_bytes_ratio = 0.5;
  p.optimizer_bytes_ratio = 0;
  p.precision = "bf16";
  p.zero = 2;
  p.offload = "optimizer";
  const std::string text = to_json(p);
  // The single figure older builds read is written too, consistent with the three.
  EXPECT_EQ(nlohmann::json::parse(text).at("optimizer_state_ratio"), 0.0) << text;
  const Profile q = profile_from_json(text, "p.json");
  EXPECT_EQ(q.param_bytes_ratio, 1.5);
  EXPECT_EQ(q.grad_bytes_ratio, 0.5);
  EXPECT_EQ(q.optimizer_bytes_ratio, 0.0);
  EXPECT_EQ(q.optimizer_state_ratio(), 0.0);
  EXPECT_EQ(q.memory_settings(), "zero 2, offload optimizer, precision bf16");
  EXPECT_EQ(to_json(q), text);
}

// A profile written before the per-kind ratios has only optimizer_state_ratio: it reads as one
// copy of the parameters, one of the gradients and the rest as optimizer state, and the memory
// model's state is the same to the byte.
TEST(Profile, AProfileWithoutTheRatiosReadsWithTheSameTotals) {
  nlohmann::json old = nlohmann::json::parse(to_json(sample()));
  for (const char* key : {"param_bytes_ratio", "grad_bytes_ratio", "optimizer_bytes_ratio",
                          "precision", "zero", "offload"})
    old.erase(key);
  for (const double ratio : {2.0, 2.1, 2.5, 0.7, -0.3}) {
    old["optimizer_state_ratio"] = ratio;
    const Profile p = profile_from_json(old.dump(), "old.json");
    EXPECT_EQ(p.param_bytes_ratio, 1.0);
    EXPECT_EQ(p.grad_bytes_ratio, 1.0);
    EXPECT_EQ(p.optimizer_bytes_ratio, ratio);
    EXPECT_NEAR(p.optimizer_state_ratio(), ratio, 1e-15);
    EXPECT_EQ(p.memory_settings(), "");
    for (const std::int64_t bytes : {0, 1, 999, 123457, 800000, 5000000}) {
      // What the memory model counted from the single ratio.
      const auto before =
          static_cast<std::int64_t>(std::llround((2.0 + ratio) * static_cast<double>(bytes)));
      const MemoryBytes state = state_memory(p, bytes);
      EXPECT_EQ(state.state(), before) << ratio << " " << bytes;
      EXPECT_EQ(state.params, bytes);
      EXPECT_EQ(state.grads, bytes);
    }
  }
}

TEST(Profile, MemoryRatiosThatDisagreeOrAreIncompleteAreRejected) {
  nlohmann::json j = nlohmann::json::parse(to_json(sample()));
  j["optimizer_state_ratio"] = 1.0;  // the three give 2
  testing::expect_user_error([&] { profile_from_json(j.dump(), "x.json"); },
                             {"x.json: malformed profile (\"optimizer_state_ratio\" = 1 but",
                              "give 2: it must be their sum less 2"});
  j.erase("optimizer_state_ratio");
  EXPECT_NO_THROW(profile_from_json(j.dump(), "x.json"));  // the three alone suffice
  j.erase("grad_bytes_ratio");
  testing::expect_user_error([&] { profile_from_json(j.dump(), "x.json"); },
                             {"x.json: malformed profile", "grad_bytes_ratio"});
  j["grad_bytes_ratio"] = 1e308;
  j["optimizer_bytes_ratio"] = 1e308;
  testing::expect_user_error([&] { profile_from_json(j.dump(), "x.json"); },
                             {"x.json: malformed profile (the memory ratios"});
}

TEST(Profile, AProfileOfAnotherModelOrMissingADegreeIsRejected) {
  const Profile p = sample();
  model::ModelConfig m = p.model;
  EXPECT_NO_THROW(check_profile_matches(p, m, 8, 2, {1, 2}, "p.json"));
  m.hidden = 256;
  EXPECT_NE(user_error_of([&] {
              check_profile_matches(p, m, 8, 2, {1, 2}, "p.json");
            })
                .find("p.json was measured for another model: model.hidden = 128 there, 256 in "
                      "this config"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] {
              check_profile_matches(p, p.model, 8, 2, {1, 2, 4}, "p.json");
            }).find("p.json has no measurements at tensor-parallel degree 4 (it has 1, 2)"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] {
              check_profile_matches(p, p.model, 4, 2, {1, 2}, "p.json");
            }).find("measured at train.micro_batch = 8 in 2 sub-batch(es)"),
            std::string::npos);
  Profile without_reshards = p;
  without_reshards.reshards.clear();
  EXPECT_NE(user_error_of([&] {
              check_profile_matches(without_reshards, p.model, 8, 2, {1, 2}, "p.json");
            }).find("p.json has no reshard time between degrees 1 and 2"),
            std::string::npos);
}

TEST(Profile, RoundTripsTheLayoutItWasMeasuredIn) {
  Profile p = sample();
  // Without sequence or context parallelism the file carries no layout keys: older readers
  // and profiles read alike.
  EXPECT_FALSE(nlohmann::json::parse(to_json(p)).contains("cp"));
  EXPECT_FALSE(nlohmann::json::parse(to_json(p)).contains("sequence_parallel"));
  p.layout.sequence_parallel = true;
  p.layout.cp = 2;
  p.layout.cp_kind = ops::ContextParallelKind::ring;
  const Profile q = profile_from_json(to_json(p), "p.json");
  EXPECT_EQ(q.layout, p.layout);
  EXPECT_EQ(q.layout.describe(), "sequence parallelism, parallel.cp = 2 (ring)");
  p.layout.cp_kind = ops::ContextParallelKind::all_to_all;
  EXPECT_EQ(profile_from_json(to_json(p), "p.json").layout, p.layout);
  EXPECT_EQ(Profile().layout.describe(), "no sequence or context parallelism");
  // A version-4 profile (before the layout) reads as measured without either.
  nlohmann::json old = nlohmann::json::parse(to_json(sample()));
  old["version"] = 4;
  EXPECT_EQ(profile_from_json(old.dump(), "old.json").layout, ProfiledLayout{});
}

TEST(Profile, AMalformedLayoutIsRejectedNamingTheKey) {
  nlohmann::json j = nlohmann::json::parse(to_json(sample()));
  j["cp"] = 2;
  testing::expect_user_error([&] { profile_from_json(j.dump(), "x.json"); },
                             {"x.json: malformed profile", "cp_kind"});
  j["cp_kind"] = "p2p";
  testing::expect_user_error([&] { profile_from_json(j.dump(), "x.json"); },
                             {"cp_kind = \"p2p\" is not known", "\"all-to-all\"", "\"ring\""});
  j["cp_kind"] = "ring";
  j["cp"] = 0;
  testing::expect_user_error([&] { profile_from_json(j.dump(), "x.json"); },
                             {"\"cp\" = 0: at least 1"});
  j["cp"] = 2;
  j["sequence_parallel"] = 1;
  testing::expect_user_error([&] { profile_from_json(j.dump(), "x.json"); },
                             {"\"sequence_parallel\" = 1: true or false"});
}

TEST(Profile, AProfileOfAnotherLayoutIsRejectedSayingWhichSettingDiffers) {
  Profile p = sample();
  p.layout.cp = 2;
  p.layout.cp_kind = ops::ContextParallelKind::ring;
  EXPECT_NO_THROW(check_profile_layout(p, p.layout, "p.json"));
  ProfiledLayout run = p.layout;
  run.cp_kind = ops::ContextParallelKind::all_to_all;
  testing::expect_user_error(
      [&] { check_profile_layout(p, run, "p.json"); },
      {"p.json was measured at parallel.cp = 2 (cp_kind \"ring\")",
       "this config runs parallel.cp = 2 (cp_kind \"all-to-all\")", "re-run `oases profile`"});
  run = ProfiledLayout{};
  testing::expect_user_error([&] { check_profile_layout(p, run, "p.json"); },
                             {"this config runs parallel.cp = 1:"});
  run = p.layout;
  run.sequence_parallel = true;
  testing::expect_user_error([&] { check_profile_layout(p, run, "p.json"); },
                             {"p.json was measured with parallel.sequence_parallel = false; this "
                              "config sets true"});
}

TEST(Profile, OtherFilesAreRejectedWithTheReason) {
  EXPECT_NE(user_error_of([] {
              profile_from_json("{", "x.json");
            }).find("x.json is not a profile: not valid JSON"),
            std::string::npos);
  EXPECT_NE(user_error_of([] {
              profile_from_json("{\"a\": 1}", "x.json");
            }).find("not a profile written by `oases profile`"),
            std::string::npos);
  std::string text = to_json(sample());
  const std::string current = "\"version\": " + std::to_string(Profile::kVersion);
  const auto at = text.find(current);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, current.size(), "\"version\": 9");
  EXPECT_NE(user_error_of([&] {
              profile_from_json(text, "x.json");
            }).find("format version 9; this build reads versions 3 to " +
                    std::to_string(Profile::kVersion)),
            std::string::npos);
  text.replace(text.find("\"version\": 9"), 12, "\"version\": 2");
  EXPECT_NE(user_error_of([&] { profile_from_json(text, "x.json"); }).find("format version 2"),
            std::string::npos);
  EXPECT_NE(user_error_of([] { read_profile("/nonexistent/p.json"); }).find("profile '/nonexistent/p.json' does not exist"),
            std::string::npos);
}

// The cases below once converted out of range (undefined behaviour), wrapped, overflowed the
// stack or threw nlohmann's exceptions (found by fuzz/profile_fuzzer.cc).
TEST(Profile, FieldsOfAnotherTypeOrOutOfRangeAreRejected) {
  const std::string text = to_json(sample());
  const auto replaced = [&](const std::string& from, const std::string& to) {
    return with_first_replaced(text, from, to);
  };
  EXPECT_NE(
      user_error_of([&] { profile_from_json(replaced("\"tp\": 2", "\"tp\": 4294967298"), "x.json"); })
          .find("x.json: malformed profile (\"tp\" = 4294967298 is not an integer in "
                "[-2147483648, 2147483647])"),
      std::string::npos);
  EXPECT_NE(user_error_of([&] {
              profile_from_json(replaced("\"rows\": 2", "\"rows\": 2.5e94"), "x.json");
            }).find("\"rows\" = 2.5e+94 is not an integer"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] {
              profile_from_json(replaced("\"core\": 0", "\"core\": 1.5"), "x.json");
            }).find("\"core\" = 1.5 is not an integer"),
            std::string::npos);
  EXPECT_NE(user_error_of([] {
              profile_from_json("{\"format\": 7}", "x.json");
            }).find("x.json is not a profile written by `oases profile`"),
            std::string::npos);
  EXPECT_NE(user_error_of([] {
              profile_from_json(R"({"format": "oases-profile", "version": "3"})", "x.json");
            }).find("x.json is a profile of format version \"3\""),
            std::string::npos);
  EXPECT_NE(user_error_of([] {
              profile_from_json("{\"format\": \"oases-profile\", \"version\": 3, \"model\": " +
                                    std::string(100000, '[') + std::string(100000, ']') + "}",
                                "x.json");
            })
                .find("x.json is damaged or not the file expected: its JSON nests deeper than 64 "
                      "levels"),
            std::string::npos);
}

// A profile's measured figures are checked when it is read: a negative time, byte count,
// slowdown or ratio is a UserError naming the file, the field and the value, instead of a
// plan priced at "inf s" or an internal error deep in the solver.

using nlohmann::json;

// The sample profile's JSON with the value at `pointer` replaced by `value`.
std::string with(const std::string& pointer, const json& value) {
  json j = json::parse(to_json(sample()));
  j[json::json_pointer(pointer)] = value;
  // The single ratio of older profiles must agree with the three; left out, it cannot.
  if (pointer.ends_with("_ratio")) j.erase("optimizer_state_ratio");
  return j.dump();
}

TEST(Profile, TheSampleReads) {
  EXPECT_EQ(user_error_of([] { (void)profile_from_json(to_json(sample()), "p.json"); }), "");
}

TEST(Profile, NegativeFiguresAreRejectedNamingTheField) {
  struct Case {
    std::string pointer;  // in the file
    std::string named;    // in the message
    json value;
  };
  const std::vector<Case> cases = {
      {"/degrees/0/segments/attention/forward_s", "segments.attention.forward_s", -0.5},
      {"/degrees/1/segments/mlp/backward1_s", "segments.mlp.backward1_s", -1e-9},
      {"/degrees/0/collectives/attention.fwd_s", "collectives.attention.fwd_s", -2.0},
      {"/degrees/0/optimizer_s", "optimizer_s", -0.01},
      {"/degrees/1/parameter_bytes", "parameter_bytes", -500000},
      {"/degrees/0/parameter_bytes_per_layer", "parameter_bytes_per_layer", -1},
      {"/degrees/0/replica_reduce_per_layer_s", "replica_reduce_per_layer_s", -3.0},
      {"/degrees/0/overlap_slowdown", "overlap_slowdown", -0.5},
      {"/degrees/1/collective_slowdown", "collective_slowdown", -7.0},
      {"/degrees/0/activation_bytes/attention/checkpoint", "activation_bytes.attention.checkpoint",
       -65536},
      {"/degrees/0/static_activation_bytes", "static_activation_bytes", -1},
      {"/degrees/0/rows", "rows", 0},
      {"/degrees/0/degree", "degree", -1},
      {"/reshards/1-2", "reshards.1-2", -2.5e-4},
      {"/micro_batch", "micro_batch", 0},
      {"/element_bytes", "element_bytes", -4},
      {"/grad_bytes_ratio", "grad_bytes_ratio", -1.0},
      {"/optimizer_bytes_ratio", "optimizer_bytes_ratio", -2.0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.pointer);
    const std::string text = with(c.pointer, c.value);
    const std::string message = user_error_of([&] { (void)profile_from_json(text, "p.json"); });
    ASSERT_FALSE(message.empty()) << "accepted " << c.pointer << " = " << c.value.dump();
    EXPECT_NE(message.find("p.json"), std::string::npos) << message;
    EXPECT_NE(message.find(c.named), std::string::npos) << message;
    {
      const std::string shown = c.value.is_number_integer()
                                    ? std::to_string(c.value.get<std::int64_t>())
                                    : fmt::format("{}", c.value.get<double>());
      EXPECT_NE(message.find(shown), std::string::npos) << message;
    }
  }
}

TEST(Profile, ReadProfileRejectsANegativeReshardAsTheUsersError) {
  testing::TempDir dir("profile");
  const std::string path = dir.file("negative.json");
  testing::write_bytes(path, with("/reshards/1-2", -1.0));
  const std::string message = user_error_of([&] { (void)read_profile(path); });
  EXPECT_NE(message.find("negative.json"), std::string::npos) << message;
  EXPECT_NE(message.find("reshards.1-2"), std::string::npos) << message;
}

}  // namespace
}  // namespace oases::planner
