// BERT for masked-language modelling (Hugging Face BertForMaskedLM, without the next-sentence
// head, as RoBERTa): word, learned position and token-type embeddings summed and normalised
// (LayerNorm, then dropout), post-LN blocks x = LN(x + attention(x)), x = LN(x + mlp(x)) with
// bidirectional attention and GeLU in its erf form, and the masked-LM head: dense + GeLU +
// LayerNorm, then the decoder tied to the word embeddings plus its own bias. LayerNorm eps is
// model.norm_eps (default 1e-12, as BERT). Linear weights are [out, in]. Names:
//   bert.embeddings.{word,position,token_type}_embeddings.weight,
//   bert.embeddings.LayerNorm.{weight,bias},
//   bert.encoder.layer.{i}.attention.self.{query,key,value}.{weight,bias},
//   bert.encoder.layer.{i}.attention.output.dense.{weight,bias},
//   bert.encoder.layer.{i}.attention.output.LayerNorm.{weight,bias},
//   bert.encoder.layer.{i}.intermediate.dense.{weight,bias},
//   bert.encoder.layer.{i}.output.dense.{weight,bias},
//   bert.encoder.layer.{i}.output.LayerNorm.{weight,bias},
//   cls.predictions.transform.dense.{weight,bias},
//   cls.predictions.transform.LayerNorm.{weight,bias}, cls.predictions.bias
// The loss is the mean cross-entropy over the masked positions of the global batch (targets
// of the other positions are negative: data/mlm.h).
#pragma once

#include "model/architecture.h"

#include <memory>

namespace oases::model {

std::unique_ptr<Architecture> make_bert(const ModelConfig& config);

}  // namespace oases::model
