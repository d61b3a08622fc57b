#include "plan/settings.h"

#include "core/error.h"
#include "core/stop_signals.h"
#include "model/config.h"
#include "ops/moe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <span>

namespace oases::plan {
namespace {

// A word-valued setting that may also be one keyword ("auto", "none") meaning "no value":
// `keyword_first` puts the keyword first or last among the valid words listed.
template <class E>
struct KeywordOr {
  std::span<const NamedValue<E>> table;
  std::string_view keyword;
  bool keyword_first = false;

  std::vector<std::string> words() const {
    std::vector<std::string> out = value_names(table);
    if (keyword_first) out.insert(out.begin(), std::string(keyword));
    else out.emplace_back(keyword);
    return out;
  }
  std::optional<E> parse(const std::string& text, std::string_view setting) const {
    if (text == keyword) return std::nullopt;
    if (const E* value = find_named_value(table, text)) return *value;
    OASES_FAIL("{} = \"{}\" is not known; valid: \"{}\"", setting, text,
               fmt::join(words(), "\", \""));
  }
};

template <class E>
KeywordOr<E> keyword_or(std::span<const NamedValue<E>> table, std::string_view keyword,
                        bool keyword_first) {
  return {table, keyword, keyword_first};
}

const auto kScheduleWords = keyword_or<schedule::ScheduleKind>(schedule::kScheduleKindNames,
                                                               kAutomatic, false);
const auto kRecomputeWords =
    keyword_or<schedule::Recompute>(schedule::kRecomputeNames, kAutomatic, false);
const auto kCompressionWords =
    keyword_or<ops::ActivationEncoding>(ops::kActivationEncodingNames, "none", true);
const auto kGemm16Words = keyword_or<kernels::Gemm16Path>(kernels::kGemm16PathNames, kAutomatic, true);

// A setting that is one word for the whole model or, with a comma, one word per layer: the
// words of a list, trimmed, checked for their count. UserError naming the setting and the
// value.
std::vector<std::string> layer_words(const std::string& text, std::string_view setting,
                                     std::int64_t layers, std::string_view example) {
  std::vector<std::string> words;
  for (std::size_t begin = 0;;) {
    const std::size_t end = text.find(',', begin);
    const std::string item =
        text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    const auto first = item.find_first_not_of(' ');
    OASES_CHECK(first != std::string::npos,
                "{} = \"{}\": layer {} has an empty word; write one word per layer separated by "
                "commas (e.g. \"{}\"), or one word for every layer",
                setting, text, words.size(), example);
    words.push_back(item.substr(first, item.find_last_not_of(' ') - first + 1));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  OASES_CHECK(static_cast<std::int64_t>(words.size()) == layers,
              "{} = \"{}\" gives {} words; a list needs one per layer, model.layers = {} (e.g. "
              "\"{}\"), or one word for every layer",
              setting, text, words.size(), layers, example);
  return words;
}

// "w,w,...,w": an example list of `layers` words (at most 8 shown).
std::string example_list(std::string_view word, std::int64_t layers) {
  std::string out;
  for (std::int64_t l = 0; l < std::clamp<std::int64_t>(layers, 1, 8); ++l)
    out += fmt::format("{}{}", l > 0 ? "," : "", word);
  return layers > 8 ? out + ",..." : out;
}

void parse_recompute(const RunConfig& c, Settings& s) {
  constexpr std::string_view kSetting = "parallel.recompute";
  const std::string& text = c.parallel.recompute;
  if (text.find(',') == std::string::npos) {
    s.recompute = kRecomputeWords.parse(text, kSetting);
    return;
  }
  const std::string per_layer = schedule::quoted_layer_recompute_names();
  const std::vector<std::string> words =
      layer_words(text, kSetting, c.model.layers, example_list("full", c.model.layers));
  for (std::size_t layer = 0; layer < words.size(); ++layer) {
    const std::string& word = words[layer];
    const schedule::Recompute* policy =
        find_named_value<schedule::Recompute>(schedule::kRecomputeNames, word);
    OASES_CHECK(word != kAutomatic && (policy == nullptr || *policy != schedule::Recompute::sqrt),
                "{} = \"{}\" gives layer {} \"{}\", which is one policy for the whole model "
                "alone; valid per layer: {}, or \"{}\" as the whole value",
                kSetting, text, layer, word, per_layer, word);
    OASES_CHECK(policy != nullptr,
                "{} = \"{}\": layer {}'s \"{}\" is not known; valid per layer: {}", kSetting, text,
                layer, word, per_layer);
    s.layer_recompute.push_back(*policy);
  }
}

ActivationCompression parse_activation_compression(const RunConfig& c) {
  constexpr std::string_view kSetting = "parallel.activation_compression";
  const std::string& text = c.parallel.activation_compression;
  ActivationCompression out;
  if (text.find(',') == std::string::npos) {
    out.whole = kCompressionWords.parse(text, kSetting);
    return out;
  }
  const std::vector<std::string> words =
      layer_words(text, kSetting, c.model.layers, example_list("bf16", c.model.layers));
  for (std::size_t layer = 0; layer < words.size(); ++layer) {
    const std::string& word = words[layer];
    if (word == kCompressionWords.keyword) {
      out.layers.emplace_back();
      continue;
    }
    const ops::ActivationEncoding* encoding =
        find_named_value<ops::ActivationEncoding>(ops::kActivationEncodingNames, word);
    OASES_CHECK(encoding != nullptr,
                "{} = \"{}\": layer {}'s \"{}\" is not known; valid per layer: \"{}\"", kSetting,
                text, layer, word, fmt::join(kCompressionWords.words(), "\", \""));
    out.layers.emplace_back(*encoding);
  }
  return out;
}

// train.save_signals: names separated by commas or spaces, at least one.
std::vector<int> parse_save_signals(const std::string& text) {
  std::vector<int> signals;
  std::string word;
  const auto take = [&] {
    if (word.empty()) return;
    const int signal_number =
        parse_named_value<int>(kStopSignalNames, word, "train.save_signals");
    if (std::find(signals.begin(), signals.end(), signal_number) == signals.end())
      signals.push_back(signal_number);
    word.clear();
  };
  for (const char c : text) {
    if (c == ',' || c == ' ') take();
    else word += c;
  }
  take();
  OASES_CHECK(!signals.empty(),
              "train.save_signals = \"{}\" names no signal; name one or more of {} (or set "
              "train.save_on_signal = false)",
              text, quoted_value_names<int>(kStopSignalNames));
  return signals;
}

// The words of a setting that is a keyword or free text (a list, a path).
std::vector<std::string> keyword_words(std::span<const NamedValue<LayerPlanSource>> table) {
  return value_names(table);
}

}  // namespace

bool ActivationCompression::any() const {
  return whole.has_value() ||
         std::ranges::any_of(layers, [](const auto& encoding) { return encoding.has_value(); });
}

std::int64_t ActivationCompression::first_layer_in(ops::ActivationEncoding encoding) const {
  if (whole) return *whole == encoding ? 0 : -1;
  for (std::size_t layer = 0; layer < layers.size(); ++layer)
    if (layers[layer] == encoding) return static_cast<std::int64_t>(layer);
  return -1;
}

std::string ActivationCompression::describe() const {
  if (whole) return ops::encoding_name(*whole);
  std::string out;
  for (const NamedValue<ops::ActivationEncoding>& encoding : ops::kActivationEncodingNames) {
    const auto count = std::ranges::count(layers, std::optional(encoding.value));
    if (count == 0) continue;
    out += fmt::format("{}{} ({} layer{})", out.empty() ? "" : ", ", encoding.name, count,
                       count == 1 ? "" : "s");
  }
  return out.empty() ? std::string(kCompressionWords.keyword) : out;
}

LayerPlanSource layer_plan_source(const std::string& plan) {
  if (const LayerPlanSource* keyword = find_named_value<LayerPlanSource>(kLayerPlanKeywords, plan))
    return *keyword;
  const bool list = !plan.empty() && plan.find_first_not_of("0123456789, ") == std::string::npos;
  return list ? LayerPlanSource::listed : LayerPlanSource::file;
}

PipelineLayersSource pipeline_layers_source(const std::string& pipeline_layers) {
  if (const PipelineLayersSource* keyword =
          find_named_value<PipelineLayersSource>(kPipelineLayersKeywords, pipeline_layers))
    return *keyword;
  return PipelineLayersSource::listed;
}

Settings parse_settings(const RunConfig& c) {
  Settings s;
  s.schedule = kScheduleWords.parse(c.parallel.schedule, "parallel.schedule");
  parse_recompute(c, s);
  s.pipeline = parse_named_value<schedule::PipelineKind>(schedule::kPipelineKindNames,
                                                         c.parallel.pipeline, "parallel.pipeline");
  s.pipeline_layers = pipeline_layers_source(c.parallel.pipeline_layers);
  s.plan = layer_plan_source(c.parallel.plan);
  s.activation_compression = parse_activation_compression(c);
  s.offload = parse_named_value<Offload>(kOffloadNames, c.parallel.offload, "parallel.offload");
  s.context_parallel = parse_named_value<ops::ContextParallelKind>(
      ops::kContextParallelKindNames, c.parallel.cp_kind, "parallel.cp_kind");
  s.optimizer = parse_named_value<optim::OptimizerKind>(optim::kOptimizerNames, c.train.optimizer,
                                                        "train.optimizer");
  s.precision = parse_named_value<Precision>(kPrecisionNames, c.train.precision, "train.precision");
  s.grad_reduce = parse_named_value<GradReduceType>(kGradReduceTypeNames, c.train.grad_reduce_dtype,
                                                    "train.grad_reduce_dtype");
  s.gemm16_path = kGemm16Words.parse(c.train.gemm16_path, "train.gemm16_path");
  s.tokenizer = parse_named_value<data::TokenizerKind>(data::kTokenizerNames, c.data.tokenizer,
                                                       "data.tokenizer");
  const std::vector<int> save_signals = parse_save_signals(c.train.save_signals);
  if (c.train.save_on_signal) s.save_signals = save_signals;
  if (c.log.flight_records > 0) s.flight_dir = flight_directory(c);
  return s;
}

std::string flight_directory(const RunConfig& config) {
  namespace fs = std::filesystem;
  if (!config.log.flight_dir.empty()) return config.log.flight_dir;
  if (!config.log.metrics.empty())
    return (fs::path(config.log.metrics).parent_path() / "flight").string();
  if (!config.checkpoint.dir.empty()) {
    fs::path dir = fs::path(config.checkpoint.dir);
    if (!dir.has_filename()) dir = dir.parent_path();  // "runs/a/ckpt/"
    return (dir.parent_path() / "flight").string();
  }
  return "flight";
}

std::vector<WordSetting> word_settings() {
  return {
      {"model.arch", value_names<model::ArchitectureKind>(model::kArchitectureNames)},
      {"model.moe_gate", value_names<ops::MoeGate>(ops::kMoeGateNames)},
      {"parallel.schedule", kScheduleWords.words()},
      {"parallel.recompute", kRecomputeWords.words()},
      {"parallel.pipeline", value_names<schedule::PipelineKind>(schedule::kPipelineKindNames)},
      {"parallel.pipeline_layers", value_names<PipelineLayersSource>(kPipelineLayersKeywords)},
      {"parallel.plan", keyword_words(kLayerPlanKeywords)},
      {"parallel.activation_compression", kCompressionWords.words()},
      {"parallel.offload", value_names<Offload>(kOffloadNames)},
      {"parallel.cp_kind", value_names<ops::ContextParallelKind>(ops::kContextParallelKindNames)},
      {"train.optimizer", value_names<optim::OptimizerKind>(optim::kOptimizerNames)},
      {"train.precision", value_names<Precision>(kPrecisionNames)},
      {"train.grad_reduce_dtype", value_names<GradReduceType>(kGradReduceTypeNames)},
      {"train.gemm16_path", kGemm16Words.words()},
      {"train.save_signals", value_names<int>(kStopSignalNames)},
      {"data.tokenizer", value_names<data::TokenizerKind>(data::kTokenizerNames)},
  };
}

}  // namespace oases::plan
