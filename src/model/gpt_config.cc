#include "model/gpt_config.h"

#include "core/error.h"

#include <fmt/format.h>

#include <vector>

namespace oases::model {

void GptConfig::validate() const {
  OASES_CHECK(arch == "gpt", "model.arch = \"{}\" is not supported; valid: \"gpt\"", arch);
  OASES_CHECK(layers >= 1, "model.layers = {} must be at least 1", layers);
  OASES_CHECK(hidden >= 1, "model.hidden = {} must be at least 1", hidden);
  OASES_CHECK(heads >= 1, "model.heads = {} must be at least 1", heads);
  OASES_CHECK(hidden % heads == 0,
              "model.heads = {} must divide model.hidden = {} (each head gets hidden/heads "
              "features); valid head counts for this hidden size are its divisors",
              heads, hidden);
  OASES_CHECK(ffn_hidden >= 1, "model.ffn_hidden = {} must be at least 1", ffn_hidden);
  OASES_CHECK(vocab_size >= 2 && vocab_size <= (std::int64_t{1} << 31) - 1,
              "model.vocab_size = {} must be in [2, 2^31)", vocab_size);
  OASES_CHECK(seq_len >= 1, "model.seq_len = {} must be at least 1", seq_len);
  OASES_CHECK(dropout >= 0.0 && dropout < 1.0, "model.dropout = {} must be in [0, 1)", dropout);
  OASES_CHECK(tie_embeddings,
              "model.tie_embeddings = false is not supported yet; the GPT LM head shares wte "
              "(set it to true)");
  OASES_CHECK(layernorm_eps > 0, "model.layernorm_eps = {} must be positive", layernorm_eps);
}

void GptConfig::validate_tensor_parallel(std::int64_t tp) const {
  OASES_CHECK(tp >= 1, "parallel.tp = {} must be at least 1", tp);
  if (heads % tp == 0 && ffn_hidden % tp == 0) return;
  // Valid degrees divide both the head count and the MLP width.
  std::vector<std::int64_t> valid;
  for (std::int64_t d = 1; d <= heads; ++d)
    if (heads % d == 0 && ffn_hidden % d == 0) valid.push_back(d);
  OASES_CHECK(heads % tp == 0,
              "parallel.tp = {} must divide model.heads = {} (each rank computes whole heads); "
              "valid tp for this model: {}",
              tp, heads, fmt::join(valid, ", "));
  OASES_FAIL("parallel.tp = {} must divide model.ffn_hidden = {} (column-parallel MLP); valid tp "
             "for this model: {}",
             tp, ffn_hidden, fmt::join(valid, ", "));
}

std::int64_t GptConfig::parameter_count() const {
  const std::int64_t C = hidden, F = ffn_hidden;
  const std::int64_t per_layer = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C +
                                 (C * F + F) + (F * C + C);
  return vocab_size * C + seq_len * C + layers * per_layer + 2 * C;
}

double GptConfig::training_flops_per_token() const {
  const double matmul_params = static_cast<double>(parameter_count() - seq_len * hidden);
  return 6.0 * matmul_params +
         12.0 * static_cast<double>(layers) * static_cast<double>(hidden) *
             static_cast<double>(seq_len);
}

}  // namespace oases::model
