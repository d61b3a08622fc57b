#include "io/safetensors_set.h"

#include "core/error.h"
#include "support/files.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace oases::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using oases::testing::expect_user_error;
using oases::testing::read_bytes;
using oases::testing::write_bytes;

class TempDir : public oases::testing::TempDir {
 public:
  TempDir() : oases::testing::TempDir("oases_safetensors_set_test") {}
};

// Writes one safetensors file holding `names`, each a [2, 3] F32 tensor of values base + i.
void write_file(const std::string& path, const std::vector<std::string>& names, float base) {
  std::vector<std::vector<float>> values;
  SafetensorsWriter writer;
  for (std::size_t k = 0; k < names.size(); ++k) {
    values.push_back({base + 6.0f * static_cast<float>(k), 1, 2, 3, 4, 5});
    writer.add_copy(names[k], DType::f32, {2, 3}, values.back().data());
  }
  writer.write(path);
}

void write_index(const std::string& path, const json& weight_map, const json& total = json()) {
  json index = {{"weight_map", weight_map}};
  if (!total.is_null()) index["metadata"] = {{"total_size", total}};
  write_bytes(path, index.dump(2));
}

// A folder as save_pretrained shards one: two shards and their index.
void write_sharded_folder(const TempDir& dir) {
  write_file(dir.file("model-00001-of-00002.safetensors"), {"a.weight", "b.weight"}, 0);
  write_file(dir.file("model-00002-of-00002.safetensors"), {"c.weight"}, 100);
  write_index(dir.file(kSafetensorsIndexFile),
              {{"a.weight", "model-00001-of-00002.safetensors"},
               {"b.weight", "model-00001-of-00002.safetensors"},
               {"c.weight", "model-00002-of-00002.safetensors"}},
              3 * 6 * 4);
}

TEST(SafetensorsSet, ReadsShardsThroughTheirIndex) {
  TempDir dir;
  write_sharded_folder(dir);
  for (const std::string& path : {dir.path().string(), dir.file(kSafetensorsIndexFile)}) {
    const SafetensorsSet set = SafetensorsSet::open(path);
    EXPECT_TRUE(set.sharded());
    EXPECT_EQ(set.file_count(), 2u);
    EXPECT_EQ(set.names(), (std::vector<std::string>{"a.weight", "b.weight", "c.weight"}));
    std::vector<double> c(6);
    set.read_f64("c.weight", {2, 3}, c.data());
    EXPECT_EQ(c, (std::vector<double>{100, 1, 2, 3, 4, 5}));
    std::vector<float> b(6);
    set.read_f32("b.weight", {2, 3}, b.data());
    EXPECT_EQ(b[0], 6.0f);
    EXPECT_NE(set.file_of("c.weight").path().find("00002-of"), std::string::npos);
  }
}

TEST(SafetensorsSet, ReadsASingleFileOrAFolderHoldingIt) {
  TempDir dir;
  write_file(dir.file("model.safetensors"), {"x"}, 7);
  for (const std::string& path : {dir.path().string(), dir.file("model.safetensors")}) {
    const SafetensorsSet set = SafetensorsSet::open(path);
    EXPECT_FALSE(set.sharded());
    EXPECT_TRUE(set.has("x"));
    expect_user_error([&] { (void)set.info("y"); }, {"no tensor 'y'"});
  }
}

TEST(SafetensorsSet, RefusesAnIndexWithAMissingShard) {
  TempDir dir;
  write_sharded_folder(dir);
  fs::remove(dir.file("model-00002-of-00002.safetensors"));
  expect_user_error([&] { (void)SafetensorsSet::open(dir.path().string()); },
                    {"c.weight", "model-00002-of-00002.safetensors", "missing", "incomplete"});
}

TEST(SafetensorsSet, RefusesATensorInTwoShards) {
  TempDir dir;
  write_sharded_folder(dir);
  // The second shard holds b.weight too; the index puts it in the first.
  write_file(dir.file("model-00002-of-00002.safetensors"), {"b.weight", "c.weight"}, 100);
  expect_user_error([&] { (void)SafetensorsSet::open(dir.path().string()); },
                    {"'b.weight'", "in that one too", "exactly one shard"});
}

TEST(SafetensorsSet, RefusesAnIndexThatDisagreesWithItsShards) {
  TempDir dir;
  write_sharded_folder(dir);
  // The index names a tensor its shard does not hold.
  write_index(dir.file(kSafetensorsIndexFile), {{"a.weight", "model-00001-of-00002.safetensors"},
                                                {"b.weight", "model-00001-of-00002.safetensors"},
                                                {"c.weight", "model-00002-of-00002.safetensors"},
                                                {"d.weight", "model-00002-of-00002.safetensors"}});
  expect_user_error([&] { (void)SafetensorsSet::open(dir.path().string()); },
                    {"'d.weight'", "does not hold it"});
  // A shard holds a tensor the index does not list.
  write_index(dir.file(kSafetensorsIndexFile), {{"a.weight", "model-00001-of-00002.safetensors"},
                                                {"c.weight", "model-00002-of-00002.safetensors"}});
  expect_user_error([&] { (void)SafetensorsSet::open(dir.path().string()); },
                    {"'b.weight'", "does not list"});
  // total_size not the shards' tensor bytes.
  write_sharded_folder(dir);
  write_index(dir.file(kSafetensorsIndexFile),
              {{"a.weight", "model-00001-of-00002.safetensors"},
               {"b.weight", "model-00001-of-00002.safetensors"},
               {"c.weight", "model-00002-of-00002.safetensors"}},
              999);
  expect_user_error([&] { (void)SafetensorsSet::open(dir.path().string()); },
                    {"total_size = 999", "72 bytes"});
  // A shard name that leaves the folder.
  write_index(dir.file(kSafetensorsIndexFile), {{"a.weight", "../elsewhere.safetensors"}});
  expect_user_error([&] { (void)SafetensorsSet::open(dir.path().string()); },
                    {"'a.weight'", "not a file name of the index's folder"});
  // Not an index at all.
  write_bytes(dir.file(kSafetensorsIndexFile), "[1, 2]");
  expect_user_error([&] { (void)SafetensorsSet::open(dir.path().string()); }, {"weight_map"});
}

TEST(SafetensorsSet, RefusesAFolderWithoutWeights) {
  TempDir dir;
  expect_user_error([&] { (void)SafetensorsSet::open(dir.path().string()); },
                    {"neither", kSafetensorsIndexFile, "model.safetensors"});
}

TEST(SafetensorsSet, WritesShardsAsSavePretrainedSplitsThem) {
  TempDir dir;
  // Four tensors of 24 bytes and one of 100: with a 50-byte limit, two per shard, the large
  // one alone.
  std::vector<float> small(6, 1.5f), large(25, -2.0f);
  std::vector<TensorToWrite> tensors;
  for (const char* name : {"t0", "t1"}) tensors.push_back({name, DType::f32, {2, 3}, small.data()});
  tensors.push_back({"big", DType::f32, {25}, large.data()});
  for (const char* name : {"t2", "t3"}) tensors.push_back({name, DType::f32, {6}, small.data()});
  const WrittenSafetensorsSet written =
      write_safetensors_set(dir.path().string(), tensors, 50, {{"format", "pt"}});
  EXPECT_EQ(written.files,
            (std::vector<std::string>{"model-00001-of-00003.safetensors",
                                      "model-00002-of-00003.safetensors",
                                      "model-00003-of-00003.safetensors", kSafetensorsIndexFile}));
  EXPECT_EQ(written.tensor_bytes, 4u * 24 + 100);
  const json index = json::parse(read_bytes(dir.file(kSafetensorsIndexFile)));
  EXPECT_EQ(index["metadata"]["total_size"], 196);
  EXPECT_EQ(index["weight_map"]["big"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["t3"], "model-00003-of-00003.safetensors");
  const SafetensorsSet set = SafetensorsSet::open(dir.path().string());
  EXPECT_EQ(set.names().size(), 5u);
  EXPECT_EQ(set.file_of("t0").metadata().at("format"), "pt");
  std::vector<float> back(25);
  set.read_f32("big", {25}, back.data());
  EXPECT_EQ(back, large);

  // Everything within the limit: one model.safetensors, and the stale index is gone.
  const WrittenSafetensorsSet single =
      write_safetensors_set(dir.path().string(), tensors, 1u << 20, {});
  EXPECT_EQ(single.files, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_FALSE(fs::exists(dir.file(kSafetensorsIndexFile)));
  EXPECT_FALSE(SafetensorsSet::open(dir.path().string()).sharded());
}

TEST(SafetensorsSet, ParsesShardSizes) {
  EXPECT_EQ(parse_byte_size("5GB", "--shard-size"), 5'000'000'000u);
  EXPECT_EQ(parse_byte_size("500MB", "--shard-size"), 500'000'000u);
  EXPECT_EQ(parse_byte_size("2GiB", "--shard-size"), 2u << 30);
  EXPECT_EQ(parse_byte_size("10kib", "--shard-size"), 10240u);
  EXPECT_EQ(parse_byte_size("1.5 MB", "--shard-size"), 1'500'000u);
  EXPECT_EQ(parse_byte_size("123", "--shard-size"), 123u);
  for (const char* bad : {"", "GB", "5XB", "-3GB", "1.2.3MB"})
    expect_user_error([&] { (void)parse_byte_size(bad, "--shard-size"); },
                      {"--shard-size", "is not a size", "5GB"});
  expect_user_error([&] { (void)parse_byte_size("0", "--shard-size"); }, {"at least 1 byte"});
}

}  // namespace
}  // namespace oases::io
