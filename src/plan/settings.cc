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
  s.recompute = kRecomputeWords.parse(c.parallel.recompute, "parallel.recompute");
  s.pipeline = parse_named_value<schedule::PipelineKind>(schedule::kPipelineKindNames,
                                                         c.parallel.pipeline, "parallel.pipeline");
  s.pipeline_layers = pipeline_layers_source(c.parallel.pipeline_layers);
  s.plan = layer_plan_source(c.parallel.plan);
  s.activation_compression =
      kCompressionWords.parse(c.parallel.activation_compression, "parallel.activation_compression");
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
