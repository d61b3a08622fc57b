#include "model/config.h"

#include "core/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace oases::model {

std::vector<std::string> architecture_names() { return {"gpt", "llama", "bert"}; }

bool ModelConfig::tied_embeddings() const {
  return tie_embeddings.value_or(arch != "llama");
}

double ModelConfig::norm_epsilon() const {
  if (norm_eps > 0) return norm_eps;
  return arch == "bert" ? 1e-12 : 1e-5;
}

void ModelConfig::validate() const {
  const auto names = architecture_names();
  OASES_CHECK(std::find(names.begin(), names.end(), arch) != names.end(),
              "model.arch = \"{}\" is not supported; valid: \"{}\"", arch,
              fmt::join(names, "\", \""));
  OASES_CHECK(layers >= 1, "model.layers = {} must be at least 1", layers);
  OASES_CHECK(hidden >= 1, "model.hidden = {} must be at least 1", hidden);
  OASES_CHECK(heads >= 1, "model.heads = {} must be at least 1", heads);
  OASES_CHECK(hidden % heads == 0,
              "model.heads = {} must divide model.hidden = {} (each head gets hidden/heads "
              "features); valid head counts for this hidden size are its divisors",
              heads, hidden);
  OASES_CHECK(kv_heads >= 0, "model.kv_heads = {} must be >= 0 (0: as many as model.heads)",
              kv_heads);
  if (kv_heads > 0) {
    OASES_CHECK(arch == "llama" || kv_heads == heads,
                "model.kv_heads = {} differs from model.heads = {}: grouped-query attention is "
                "a model.arch = \"llama\" setting; for \"{}\" leave kv_heads at 0 (or = heads)",
                kv_heads, heads, arch);
    OASES_CHECK(heads % kv_heads == 0,
                "model.kv_heads = {} must divide model.heads = {} (each key/value head serves "
                "heads / kv_heads query heads)",
                kv_heads, heads);
  }
  OASES_CHECK(ffn_hidden >= 1, "model.ffn_hidden = {} must be at least 1", ffn_hidden);
  OASES_CHECK(vocab_size >= 2 && vocab_size <= (std::int64_t{1} << 31) - 1,
              "model.vocab_size = {} must be in [2, 2^31)", vocab_size);
  OASES_CHECK(seq_len >= 1, "model.seq_len = {} must be at least 1", seq_len);
  OASES_CHECK(dropout >= 0.0 && dropout < 1.0, "model.dropout = {} must be in [0, 1)", dropout);
  OASES_CHECK(norm_eps >= 0, "model.norm_eps = {} must be positive (0: the architecture's default)",
              norm_eps);
  OASES_CHECK(rope_theta > 0, "model.rope_theta = {} must be positive", rope_theta);
  if (arch == "llama") {
    OASES_CHECK(head_dim() % 2 == 0,
                "model.hidden / model.heads = {} must be even for rotary position embedding "
                "(model.arch = \"llama\")",
                head_dim());
  }
  if (arch == "gpt" || arch == "bert") {
    OASES_CHECK(tied_embeddings(),
                "model.tie_embeddings = false is not supported for model.arch = \"{}\", whose LM "
                "head shares the word embedding; set it to true (or leave it out)",
                arch);
  }
  if (arch == "bert") {
    OASES_CHECK(seq_len >= 3,
                "model.seq_len = {} is too short for BERT, whose sequences hold [CLS], at least "
                "one token and [SEP]; use at least 3",
                seq_len);
  }
}

void ModelConfig::validate_tensor_parallel(std::int64_t tp) const {
  OASES_CHECK(tp >= 1, "parallel.tp = {} must be at least 1", tp);
  const std::int64_t kv = kv_head_count();
  if (heads % tp == 0 && kv % tp == 0 && ffn_hidden % tp == 0) return;
  // Valid degrees divide the head counts and the MLP width. Only those up to 4096 are listed,
  // so that absurd sizes cannot stall the message.
  constexpr std::int64_t kMaxListed = 4096;
  std::vector<std::string> valid;
  for (std::int64_t d = 1; d <= std::min(heads, kMaxListed); ++d)
    if (heads % d == 0 && kv % d == 0 && ffn_hidden % d == 0) valid.push_back(std::to_string(d));
  if (heads > kMaxListed) valid.push_back("...");
  OASES_CHECK(heads % tp == 0,
              "parallel.tp = {} must divide model.heads = {} (each rank computes whole heads); "
              "valid tp for this model: {}",
              tp, heads, fmt::join(valid, ", "));
  OASES_CHECK(kv % tp == 0,
              "parallel.tp = {} must divide model.kv_heads = {} (each rank holds whole key/value "
              "heads); valid tp for this model: {}",
              tp, kv, fmt::join(valid, ", "));
  OASES_FAIL("parallel.tp = {} must divide model.ffn_hidden = {} (column-parallel MLP); valid tp "
             "for this model: {}",
             tp, ffn_hidden, fmt::join(valid, ", "));
}

std::int64_t ModelConfig::parameter_count() const {
  const std::int64_t C = hidden, F = ffn_hidden, V = vocab_size, S = seq_len;
  const std::int64_t A = heads * head_dim(), KV = kv_head_count() * head_dim();
  if (arch == "llama") {
    const std::int64_t per_layer = 2 * C + C * (A + 2 * KV) + A * C + 3 * C * F;
    return V * C * (tied_embeddings() ? 1 : 2) + layers * per_layer + C;
  }
  if (arch == "bert") {
    const std::int64_t per_layer = 4 * (C * C + C) + 2 * C + (C * F + F) + (F * C + C) + 2 * C;
    return V * C + S * C + 2 * C + 2 * C + layers * per_layer + (C * C + C) + 2 * C + V;
  }
  const std::int64_t per_layer = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C +
                                 (C * F + F) + (F * C + C);
  return V * C + S * C + layers * per_layer + 2 * C;
}

double ModelConfig::training_flops_per_token() const {
  std::int64_t lookups = 0;  // parameters read by index, not multiplied
  if (arch == "gpt") lookups = seq_len * hidden;
  else if (arch == "bert") lookups = seq_len * hidden + 2 * hidden;
  else if (!tied_embeddings()) lookups = vocab_size * hidden;
  return 6.0 * static_cast<double>(parameter_count() - lookups) +
         12.0 * static_cast<double>(layers) * static_cast<double>(hidden) *
             static_cast<double>(seq_len);
}

}  // namespace oases::model
