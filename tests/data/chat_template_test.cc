#include "data/chat_template.h"

#include "core/error.h"

#include "support/command.h"
#include "support/files.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

namespace oases::data {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using oases::testing::expect_user_error;
using oases::testing::read_bytes;
using oases::testing::write_bytes;

const fs::path kFixtures = fs::path(OASES_SOURCE_DIR) / "tests/data/chat_templates";

std::string fixture_text(const std::string& name) {
  const fs::path path = kFixtures / (name + ".jinja");
  EXPECT_TRUE(fs::exists(path)) << path;
  return read_bytes(path.string());
}

ChatTemplate fixture(const std::string& name) {
  return ChatTemplate::parse(fixture_text(name), name + ".jinja");
}

std::string render(std::string_view text, const Json& variables = Json::object()) {
  return ChatTemplate::parse(text, "test").render(variables);
}

Json message(const std::string& role, const std::string& content) {
  return Json{{"role", role}, {"content", content}};
}

// The conversations the templates are compared on.
struct Conversation {
  std::string name;
  Json messages;
};

std::vector<Conversation> conversations() {
  return {
      {"system_two_turns",
       Json::array({message("system", "You are a helpful assistant."), message("user", "Hello!"),
                    message("assistant", "Hi there. How can I help?"),
                    message("user", "What is 2+2?"), message("assistant", "4")})},
      {"one_turn", Json::array({message("user", "hi"), message("assistant", "hello")})},
      {"three_turns", Json::array({message("user", "one"), message("assistant", "1"),
                                   message("user", "two"), message("assistant", "2"),
                                   message("user", "three"), message("assistant", "3")})},
      {"ends_with_user",
       Json::array({message("user", "q1"), message("assistant", "a1"), message("user", "q2")})},
      {"empty_contents", Json::array({message("user", ""), message("assistant", ""),
                                      message("user", "again"), message("assistant", "")})},
      {"unicode", Json::array({message("user", "  naïve café — 漢字 😀\n\ttabs and “quotes”  "),
                               message("assistant", "Réponse : ✓ 日本語\n\nSecond paragraph.\n")})},
      {"not_alternating", Json::array({message("user", "first"), message("user", "second"),
                                       message("assistant", "answer")})},
  };
}

Json base_variables(const std::string& template_name) {
  if (template_name.rfind("llama3", 0) == 0)
    return Json{{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}};
  return Json{{"bos_token", "<s>"}, {"eos_token", "</s>"}};
}

Json weather_tools() {
  return Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "The weather in a city", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "description": "The city"}},
      "required": ["city"]}}}])");
}

// ---------------------------------------------------------------------------------------
// Comparison with @huggingface/jinja (run by node; skips without node or the package)

using oases::testing::shell_quote;

fs::path jinja_package() {
  const char* cache = std::getenv("OASES_CACHE");
  const char* home = std::getenv("HOME");
  const fs::path root = cache != nullptr && *cache != '\0' ? fs::path(cache)
                        : home != nullptr                  ? fs::path(home) / ".cache/oases"
                                                           : fs::path(".cache/oases");
  return root / "npm/node_modules/@huggingface/jinja";
}

struct ReferenceCase {
  std::string template_name;
  Json variables;
};

// The reference's result for each case: {"output": ...} or {"error": ...}.
Json run_reference(const std::vector<ReferenceCase>& cases, const std::vector<std::string>& names) {
  Json input{{"templates", Json::object()}, {"cases", Json::array()}};
  for (const std::string& name : names) input["templates"][name] = fixture_text(name);
  for (const ReferenceCase& c : cases)
    input["cases"].push_back(Json{{"template", c.template_name}, {"variables", c.variables}});
  oases::testing::TempDir dir("oases_chat_template_test");
  write_bytes(dir.file("cases.json"), input.dump());
  const std::string driver = std::string(OASES_SOURCE_DIR) + "/tests/data/jinja_reference.js";
  const auto result = oases::testing::run_command("node " + shell_quote(driver) + " " +
                                                  shell_quote(jinja_package().string()) + " " +
                                                  shell_quote(dir.file("cases.json")));
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return Json::parse(result.output);
}

#define SKIP_WITHOUT_REFERENCE()                                                     \
  do {                                                                               \
    if (oases::testing::run_command("node --version").exit_code != 0)                \
      GTEST_SKIP() << "no `node` on PATH; bash scripts/install-deps.sh installs it"; \
    if (!fs::exists(jinja_package() / "package.json"))                               \
      GTEST_SKIP() << "no " << jinja_package().string()                              \
                   << " (the npm package @huggingface/jinja@0.5.13); bash "          \
                      "scripts/install-deps.sh installs it";                         \
  } while (0)

const std::vector<std::string> kModelTemplates = {"llama3", "llama3_1", "chatml",
                                                  "zephyr", "mistral",  "mistral_v0_3"};

// Every model template on every conversation, with and without the generation prompt, plus
// Llama 3.1's date, tools and tool-call paths, Mistral v0.3's tools, and the templates that
// exercise each construct.
std::vector<ReferenceCase> reference_cases() {
  std::vector<ReferenceCase> cases;
  for (const std::string& name : kModelTemplates)
    for (const Conversation& conversation : conversations())
      for (const bool generation_prompt : {false, true}) {
        Json variables = base_variables(name);
        variables["messages"] = conversation.messages;
        variables["add_generation_prompt"] = generation_prompt;
        cases.push_back({name, variables});
      }
  const Json one_turn = conversations()[1].messages;
  const Json with_system = conversations()[0].messages;
  Json variables = base_variables("llama3_1");
  variables["messages"] = with_system;
  variables["date_string"] = "01 Jan 2025";
  cases.push_back({"llama3_1", variables});
  variables["tools"] = weather_tools();
  cases.push_back({"llama3_1", variables});
  variables["tools_in_user_message"] = false;
  cases.push_back({"llama3_1", variables});
  variables = base_variables("llama3_1");
  variables["messages"] = Json::parse(R"([
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "tool_calls": [{"type": "function", "function": {
          "name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "content": "{\"temperature\": 21}"},
      {"role": "assistant", "content": "It is 21 degrees."}])");
  cases.push_back({"llama3_1", variables});
  variables = base_variables("mistral_v0_3");
  variables["messages"] = conversations()[2].messages;
  variables["tools"] = weather_tools();
  cases.push_back({"mistral_v0_3", variables});

  const Json extra = Json{{"x", 1}, {"y", "two"}};
  const Json tools_list = Json::parse(
      R"([{"name": "n1", "kind": "a"}, {"name": "n2", "kind": "b"}, {"name": "n3", "kind": "a"}])");
  for (const std::string name : {"control", "expressions"})
    for (const Conversation& conversation : conversations()) {
      Json construct_variables{
          {"messages", conversation.messages}, {"extra", extra}, {"tools_list", tools_list}};
      cases.push_back({name, construct_variables});
    }
  Json empty{{"messages", Json::array()}, {"extra", Json::object()}, {"tools_list", tools_list}};
  cases.push_back({"control", empty});
  return cases;
}

TEST(ChatTemplateReference, RendersAsHuggingFaceJinja) {
  SKIP_WITHOUT_REFERENCE();
  std::vector<std::string> names = kModelTemplates;
  names.push_back("control");
  names.push_back("expressions");
  const std::vector<ReferenceCase> cases = reference_cases();
  const Json expected = run_reference(cases, names);
  ASSERT_EQ(expected.size(), cases.size());
  std::map<std::string, ChatTemplate> templates;
  for (const std::string& name : names) templates.emplace(name, fixture(name));
  int rendered = 0, refused = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(fmt::format("case {}: template {}, variables {}", i, cases[i].template_name,
                             cases[i].variables.dump()));
    const ChatTemplate& chat_template = templates.at(cases[i].template_name);
    if (expected[i].contains("output")) {
      std::string output;
      try {
        output = chat_template.render(cases[i].variables);
      } catch (const UserError& e) {
        ADD_FAILURE() << "the reference renders, this throws: " << e.what();
        continue;
      }
      EXPECT_EQ(output, expected[i]["output"].get<std::string>());
      ++rendered;
    } else {
      // Both refuse; a raise_exception carries the template's own message.
      const std::string reference_error = expected[i]["error"].get<std::string>();
      try {
        chat_template.render(cases[i].variables);
        ADD_FAILURE() << "the reference fails (" << reference_error << "), this renders";
      } catch (const UserError& e) {
        const std::string message = e.what();
        if (message.find("refused the input") != std::string::npos) {
          EXPECT_NE(message.find(reference_error), std::string::npos) << message;
        }
      }
      ++refused;
    }
  }
  std::printf("%d renders and %d refusals agree with @huggingface/jinja\n", rendered, refused);
  EXPECT_GT(rendered, 80);
  EXPECT_GT(refused, 3);  // Mistral's alternation rule and its system message
}

// The segments against the span rule applied to the reference's own renders: they
// concatenate to the reference's rendering of the whole conversation, and the trained text of
// each assistant message is the reference's turn minus its generation prompt.
TEST(ChatTemplateReference, SegmentsFollowTheReferenceRenders) {
  SKIP_WITHOUT_REFERENCE();
  struct Expectation {
    std::string template_name;
    Json messages;
    std::size_t whole;                                       // case index
    std::vector<std::pair<std::size_t, std::size_t>> turns;  // (prompt, turn) case indices
  };
  std::vector<ReferenceCase> cases;
  std::vector<Expectation> expectations;
  const auto add_case = [&](const std::string& name, const Json& messages, std::size_t count,
                            bool generation_prompt) {
    Json variables = base_variables(name);
    variables["messages"] =
        Json(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(count));
    variables["add_generation_prompt"] = generation_prompt;
    cases.push_back({name, variables});
    return cases.size() - 1;
  };
  for (const std::string& name : kModelTemplates)
    for (const Conversation& conversation : conversations()) {
      if (conversation.name == "not_alternating") continue;
      Expectation e{name,
                    conversation.messages,
                    add_case(name, conversation.messages, conversation.messages.size(), false),
                    {}};
      for (std::size_t i = 0; i < conversation.messages.size(); ++i)
        if (conversation.messages[i]["role"] == "assistant")
          e.turns.emplace_back(add_case(name, conversation.messages, i, true),
                               add_case(name, conversation.messages, i + 1, false));
      expectations.push_back(std::move(e));
    }
  const Json reference = run_reference(cases, kModelTemplates);
  ASSERT_EQ(reference.size(), cases.size());
  int checked = 0, unstable = 0;
  for (const Expectation& e : expectations) {
    SCOPED_TRACE(fmt::format("template {}, messages {}", e.template_name, e.messages.dump()));
    if (!reference[e.whole].contains("output")) continue;  // Mistral refuses a system message
    const std::string whole = reference[e.whole]["output"];
    std::vector<std::string> trained;
    bool stable = true;
    std::size_t end_of_previous = 0;
    for (const auto& [prompt_case, turn_case] : e.turns) {
      const std::string prompt = reference[prompt_case]["output"];
      const std::string turn = reference[turn_case]["output"];
      stable = stable && turn.rfind(prompt, 0) == 0 && whole.rfind(turn, 0) == 0 &&
               prompt.size() >= end_of_previous;
      if (!stable) break;
      if (turn.size() > prompt.size()) trained.push_back(turn.substr(prompt.size()));
      end_of_previous = turn.size();
    }
    const ChatTemplate chat_template = fixture(e.template_name);
    if (!stable) {
      expect_user_error(
          [&] { render_chat(chat_template, e.messages, base_variables(e.template_name)); },
          {"not prefix-stable", e.template_name});
      ++unstable;
      continue;
    }
    const std::vector<ChatSegment> segments =
        render_chat(chat_template, e.messages, base_variables(e.template_name));
    std::string joined;
    std::vector<std::string> trained_segments;
    for (std::size_t k = 0; k < segments.size(); ++k) {
      EXPECT_FALSE(segments[k].text.empty());
      if (k > 0) {
        EXPECT_NE(segments[k].trained, segments[k - 1].trained);
      }
      joined += segments[k].text;
      if (segments[k].trained) trained_segments.push_back(segments[k].text);
    }
    EXPECT_EQ(joined, whole);
    EXPECT_EQ(trained_segments, trained);
    ++checked;
  }
  EXPECT_GT(checked, 25);
  EXPECT_GE(unstable, 1);  // Mistral v0.3 moves the system message into the last user turn
}

// ---------------------------------------------------------------------------------------
// Segments (no reference needed)

TEST(RenderChat, MarksExactlyTheAssistantRepliesOfChatML) {
  const Json messages = Json::array({message("system", "Be brief."), message("user", "Hi"),
                                     message("assistant", "Hello!"), message("user", "Bye"),
                                     message("assistant", "Goodbye.")});
  const std::vector<ChatSegment> segments =
      render_chat(fixture("chatml"), messages, Json::object());
  const std::vector<ChatSegment> expected = {
      {"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
       "<|im_start|>assistant\n",
       false},
      {"Hello!<|im_end|>\n", true},
      {"<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", false},
      {"Goodbye.<|im_end|>\n", true}};
  EXPECT_EQ(segments, expected);
}

TEST(RenderChat, IncludesTheEndOfTurnMarkerAndNotTheHeader) {
  const Json messages =
      Json::array({message("user", " q "), message("assistant", " a "), message("user", "next")});
  const std::vector<ChatSegment> segments =
      render_chat(fixture("llama3"), messages, base_variables("llama3"));
  const std::vector<ChatSegment> expected = {
      {"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n",
       false},
      {"a<|eot_id|>", true},
      {"<|start_header_id|>user<|end_header_id|>\n\nnext<|eot_id|>", false}};
  EXPECT_EQ(segments, expected);
  // Mistral's template ignores the generation prompt: the reply follows [/INST] directly.
  const std::vector<ChatSegment> mistral = render_chat(
      fixture("mistral"), Json::array({message("user", "q"), message("assistant", "a")}),
      base_variables("mistral"));
  EXPECT_EQ(mistral, (std::vector<ChatSegment>{{"<s>[INST] q [/INST]", false}, {"a</s>", true}}));
}

TEST(RenderChat, ConversationsWithoutRepliesAreUntrained) {
  const std::vector<ChatSegment> segments =
      render_chat(fixture("chatml"), Json::array({message("user", "alone")}), Json::object());
  EXPECT_EQ(segments, (std::vector<ChatSegment>{{"<|im_start|>user\nalone<|im_end|>\n", false}}));
  EXPECT_TRUE(render_chat(fixture("chatml"), Json::array(), Json::object()).empty());
}

TEST(RenderChat, RefusesTemplatesThatAreNotPrefixStable) {
  // Mistral v0.3 puts the system message into the last user turn, so the prompt for the first
  // reply (where that turn is last) is not the start of the longer conversation.
  const Json messages =
      Json::array({message("system", "S"), message("user", "q1"), message("assistant", "a1"),
                   message("user", "q2"), message("assistant", "a2")});
  expect_user_error(
      [&] { render_chat(fixture("mistral_v0_3"), messages, base_variables("mistral_v0_3")); },
      {"mistral_v0_3.jinja", "not prefix-stable", "message 2", "[INST] S"});
  // A header that counts the messages changes with every message.
  const ChatTemplate counting = ChatTemplate::parse(
      "{{ messages | length }} messages\n{% for m in messages %}{{ m.content }};{% endfor %}",
      "counting.jinja");
  expect_user_error(
      [&] {
        render_chat(counting, Json::array({message("user", "u"), message("assistant", "a")}), {});
      },
      {"counting.jinja", "not prefix-stable", "message 1"});
}

TEST(RenderChat, ChecksTheMessagesAndNamesThePrefixThatFailed) {
  const ChatTemplate chatml = fixture("chatml");
  expect_user_error(
      [&] {
        render_chat(chatml, Json{{"role", "user"}}, {});
      },
      {"must be a JSON list", "object"});
  expect_user_error([&] { render_chat(chatml, Json::array({"text"}), {}); },
                    {"chat message 0", "JSON object", "string"});
  expect_user_error(
      [&] {
        render_chat(chatml, Json::array({Json{{"content", "x"}}}), {});
      },
      {"chat message 0", "\"role\""});
  expect_user_error(
      [&] {
        render_chat(
            fixture("mistral"),
            Json::array({message("user", "a"), message("user", "b"), message("assistant", "c")}),
            base_variables("mistral"));
      },
      {"Conversation roles must alternate", "mistral.jinja"});
}

// ---------------------------------------------------------------------------------------
// Errors

TEST(ChatTemplateErrors, SyntaxErrorsNameTheSourceLineAndColumn) {
  expect_user_error(
      [] { ChatTemplate::parse("Hello\n  {% if x %}\n{{ x + }}{% endif %}", "bad.jinja"); },
      {"bad.jinja", "line 3, column 8", "expected an expression", "}}"});
  expect_user_error([] { ChatTemplate::parse("{% for m in messages %}{{ m }}", "loop.jinja"); },
                    {"loop.jinja", "line 1, column 1", "never closed with {% endfor %}"});
  expect_user_error([] { ChatTemplate::parse("ok {{ 'open", "s.jinja"); },
                    {"s.jinja", "line 1, column 7", "string literal is never closed"});
  expect_user_error([] { ChatTemplate::parse("{% include 'x' %}", "i.jinja"); },
                    {"unsupported statement 'include'", "line 1, column 1"});
  expect_user_error([] { ChatTemplate::parse("a\n{% endif %}", "e.jinja"); },
                    {"line 2, column 1", "{% endif %} without"});
  expect_user_error([] { ChatTemplate::parse("{{ 'é' }}{{ x $ y }}", "c.jinja"); },
                    {"line 1, column 15", "unexpected character \"$\""});
  expect_user_error([] { ChatTemplate::parse("{{ " + std::string(1000, '(') + "1 }}", "n.jinja"); },
                    {"nest deeper than 200"});
  expect_user_error([] { ChatTemplate::parse("{% break %}", "b.jinja"); },
                    {"{% break %} outside a for loop"});
  expect_user_error([] { ChatTemplate::parse("{{ '\\q' }}", "q.jinja"); },
                    {"unknown escape \"\\\\q\""});
}

TEST(ChatTemplateErrors, UnknownFiltersFailWhenReached) {
  // Shipped templates name filters in branches real conversations never take.
  const ChatTemplate t =
      ChatTemplate::parse("{% if x %}\n  {{ x | frobnicate }}{% endif %}ok", "f.jinja");
  EXPECT_EQ(t.render(Json::object()), "ok");
  expect_user_error(
      [&] {
        t.render(Json{{"x", 1}});
      },
      {"f.jinja", "line 2, column 10", "unknown filter 'frobnicate'", "trim"});
  expect_user_error([] { render("{{ 1 is frobnicated }}"); }, {"unknown test 'frobnicated'"});
  expect_user_error([] { render("{{ 'a'.nosuch() }}"); }, {"strings have no method 'nosuch'"});
  expect_user_error([] { render("{{ nosuch() }}"); },
                    {"'nosuch' is an undefined value, not a function"});
}

TEST(ChatTemplateErrors, RaiseExceptionCarriesTheTemplatesMessage) {
  expect_user_error(
      [] {
        render("line one\n{%- if true %}{{ raise_exception('Roles must alternate!') }}{% endif %}");
      },
      {"chat template test refused the input", "line 2, column 18", "Roles must alternate!"});
}

TEST(ChatTemplateErrors, OperationsOnTheWrongTypesNameThem) {
  expect_user_error(
      [] {
        render("{{ messages[0].content - 1 }}",
               Json{{"messages", Json::array({message("user", "x")})}});
      },
      {"line 1, column 24", "cannot apply '-' to a string and an integer"});
  expect_user_error([] { render("{{ missing + 'x' }}"); },
                    {"'+' to an undefined value and a string"});
  expect_user_error([] { render("{{ missing | trim }}"); },
                    {"'trim' cannot take an undefined value"});
  expect_user_error([] { render("{{ 1 / 0 }}"); }, {"'/' by zero"});
  expect_user_error([] { render("{% set x.y = 1 %}"); }, {"only namespace() objects"});
  expect_user_error([] { render("{% for a, b in [1] %}{% endfor %}"); },
                    {"cannot unpack an integer"});
  expect_user_error([] { ChatTemplate::parse("x", "t").render(Json::array()); },
                    {"must be a JSON object"});
}

// ---------------------------------------------------------------------------------------
// Semantics where this follows Python's Jinja2 rather than the JavaScript reference, and
// details the reference comparison does not reach.

TEST(ChatTemplate, UndefinedVariablesAreEmptyAndFalsy) {
  EXPECT_EQ(render("[{{ nothing }}][{% if nothing %}yes{% else %}no{% endif %}][{{ nothing.x }}]"),
            "[][no][]");
  EXPECT_EQ(render("{% for x in nothing %}{{ x }}{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(render("{{ nothing ~ 'x' }}"), "x");
}

TEST(ChatTemplate, FollowsPythonWhereTheJavaScriptReferenceDiffers) {
  EXPECT_EQ(render("{{ -7 % 3 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7.5 % 2 }}"), "2 -4 -2 0.5");
  EXPECT_EQ(render("{{ 'b' > 'a' }} {{ 'abc' < 'abd' }}"), "true true");
  EXPECT_EQ(
      render("{{ '\\n\\nx\\n'.strip('\\n') }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx' | trim('x') }}"),
      "x|axx|a");
  EXPECT_EQ(render("{{ [1, {'a': 2}] == [1, {'a': 2}] }} {{ '1' == 1 }}"), "true false");
  EXPECT_EQ(render("{{ x }} {{ x | tojson }}", Json{{"x", 2.0}}), "2.0 2");
  EXPECT_EQ(render("{{ '12abc' | int }} {{ ' 42 ' | int }} {{ '3.7' | int }} {{ 'x' | int(7) }}"),
            "0 42 3 7");
  EXPECT_EQ(render("{{ 'ab' * 3 }} {{ [1, 2, 3, 4] | select('even') | list }} {{ [1, 2, 3] | "
                   "reject('odd') | join }}"),
            "ababab [2, 4] 2");
  EXPECT_EQ(render("{{ ['a', 'b', 'c'] | reject('equalto', 'b') | join(', ') }}"), "a, c");
  EXPECT_EQ(render("{{ ['B', 'a', 'C'] | sort }} {{ ['B', 'a', 'C'] | sort(case_sensitive=true) }} "
                   "{{ [3, 1] | sort(reverse=true) }}"),
            "[\"a\", \"B\", \"C\"] [\"B\", \"C\", \"a\"] [3, 1]");
}

TEST(ChatTemplate, Llama31NamesItsBuiltinToolsWithoutTheCodeInterpreter) {
  Json variables = base_variables("llama3_1");
  variables["messages"] = Json::array({message("user", "hi")});
  variables["builtin_tools"] = Json::array({"brave_search", "code_interpreter", "wolfram_alpha"});
  variables["date_string"] = "02 Feb 2025";
  EXPECT_EQ(fixture("llama3_1").render(variables),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Environment: ipython\nTools: brave_search, wolfram_alpha\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 02 Feb 2025\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
}

TEST(ChatTemplate, KeepsTheKeyOrderOfItsInput) {
  const Json tool = Json::parse(R"({"zeta": 1, "alpha": {"y": true, "b": null}})");
  EXPECT_EQ(
      render("{{ t | tojson }}|{% for k, v in t.items() %}{{ k }};{% endfor %}", Json{{"t", tool}}),
      "{\"zeta\": 1, \"alpha\": {\"y\": true, \"b\": null}}|zeta;alpha;");
  EXPECT_EQ(render("{{ t | tojson(sort_keys=true, separators=[',', ':']) }}", Json{{"t", tool}}),
            "{\"alpha\":{\"b\":null,\"y\":true},\"zeta\":1}");
  EXPECT_EQ(render("{{ 'é😀' | tojson(ensure_ascii=true) }}"), "\"\\u00e9\\ud83d\\ude00\"");
}

TEST(ChatTemplate, StrftimeNowFormatsTheLocalTime) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  const std::string year = std::to_string(local.tm_year + 1900);
  const std::string rendered = render("{{ strftime_now('%Y') }}");
  // A render across New Year's midnight may see the next year.
  EXPECT_TRUE(rendered == year || rendered == std::to_string(local.tm_year + 1901)) << rendered;
}

TEST(ChatTemplate, MacrosScopesAndRecursionLimits) {
  EXPECT_EQ(
      render("{% macro f(a, b=a * 2) %}{{ a }}+{{ b }}{% endmacro %}{{ f(1) }} {{ f(1, 5) }}"),
      "1+2 1+5");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in [1] %}{% set ns.x = 2 %}{% endfor "
                   "%}{{ ns.x }}"),
            "2");
  expect_user_error([] { render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"); },
                    {"macro calls nest deeper than"});
  expect_user_error([] { render("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}"); },
                    {"macro 'f' takes at most 1 arguments, got 2"});
}

// ---------------------------------------------------------------------------------------
// Model folders

TEST(LoadModelChatTemplate, ReadsTokenizerConfigAndPrefersChatTemplateJinja) {
  oases::testing::TempDir dir("oases_chat_template_folder");
  Json config{{"bos_token", Json{{"content", "<s>"}, {"lstrip", false}}},
              {"eos_token", "</s>"},
              {"chat_template",
               "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"}};
  write_bytes(dir.file("tokenizer_config.json"), config.dump());
  ModelChatTemplate loaded = load_model_chat_template(dir.path().string());
  EXPECT_EQ(loaded.variables, (Json{{"bos_token", "<s>"}, {"eos_token", "</s>"}}));
  Json variables = loaded.variables;
  variables["messages"] = Json::array({message("user", "x")});
  EXPECT_EQ(loaded.chat_template.render(variables), "<s>x</s>");

  config["chat_template"] = Json::array({Json{{"name", "tool_use"}, {"template", "tools"}},
                                         Json{{"name", "default"}, {"template", "default"}}});
  write_bytes(dir.file("tokenizer_config.json"), config.dump());
  EXPECT_EQ(load_model_chat_template(dir.path().string()).chat_template.render(Json::object()),
            "default");

  write_bytes(dir.file("chat_template.jinja"), "from the jinja file\n");
  loaded = load_model_chat_template(dir.path().string());
  EXPECT_EQ(loaded.chat_template.render(Json::object()), "from the jinja file");
  EXPECT_NE(loaded.chat_template.source().find("chat_template.jinja"), std::string::npos);
}

TEST(LoadModelChatTemplate, RefusesFoldersWithoutATemplate) {
  oases::testing::TempDir dir("oases_chat_template_folder");
  expect_user_error([&] { load_model_chat_template(dir.path().string()); },
                    {"has no chat template", "chat_template.jinja", "tokenizer_config.json"});
  write_bytes(dir.file("tokenizer_config.json"), "{not json");
  expect_user_error([&] { load_model_chat_template(dir.path().string()); }, {"is not valid JSON"});
  write_bytes(
      dir.file("tokenizer_config.json"),
      Json{{"chat_template", Json::array({Json{{"name", "rag"}, {"template", "x"}}})}}.dump());
  expect_user_error([&] { load_model_chat_template(dir.path().string()); },
                    {"none named \"default\"", "rag"});
  write_bytes(dir.file("tokenizer_config.json"), Json{{"chat_template", "{% if %}"}}.dump());
  expect_user_error([&] { load_model_chat_template(dir.path().string()); },
                    {"tokenizer_config.json (chat_template)", "line 1, column 7"});
}

}  // namespace
}  // namespace oases::data
