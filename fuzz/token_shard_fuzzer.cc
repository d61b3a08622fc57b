// libFuzzer target: data::load_token_shard on arbitrary file contents.
//
// An accepted shard must match data/token_shard.h: the file is exactly the header (52 bytes in
// version 3, 48 in version 2, 44 in version 1) plus count x width bytes (plus ceil(count / 8)
// bytes of loss mask in version 3, one 0 or 1 per token), the width is 2 or 4 and holds the
// vocabulary, the tokenizer name is 1 to 16 printable characters, and every token lies in [0,
// vocab_size).
#include "data/token_shard.h"
#include "fuzz_support.h"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using oases::fuzz::require;
  static const oases::fuzz::ScratchFile scratch("token_shard");
  scratch.write(data, size);
  oases::data::TokenShard shard;
  if (!oases::fuzz::accepts([&] { shard = oases::data::load_token_shard(scratch.path()); }))
    return 0;
  require(shard.token_width == 2 || shard.token_width == 4, "accepted a token width not 2 or 4");
  require(shard.version >= 1 && shard.version <= 3, "accepted a format version not 1, 2 or 3");
  const std::size_t header = shard.version == 1   ? oases::data::kTokenShardV1HeaderBytes
                             : shard.version == 2 ? oases::data::kTokenShardHeaderBytes
                                                  : oases::data::kTokenShardMaskedHeaderBytes;
  const std::size_t mask_bytes = shard.version == 3 ? (shard.tokens.size() + 7) / 8 : 0;
  require(size == header + shard.tokens.size() * shard.token_width + mask_bytes,
          "accepted a file whose size is not header + count x width (+ the mask's bytes)");
  require(
      shard.version == 3 ? shard.loss_mask.size() == shard.tokens.size() : shard.loss_mask.empty(),
      "accepted a loss mask whose length is not the token count, or one without version 3");
  for (const std::uint8_t counts : shard.loss_mask)
    require(counts <= 1, "accepted a loss mask value other than 0 or 1");
  require(shard.vocab_size >= 1 &&
              shard.vocab_size <= (shard.token_width == 2 ? 65536 : std::int64_t{1} << 31),
          "accepted a vocabulary its token width cannot hold");
  require(!shard.tokenizer.empty() && shard.tokenizer.size() <= oases::data::kTokenShardNameBytes,
          "accepted an empty or over-long tokenizer name");
  for (const std::int32_t token : shard.tokens)
    require(token >= 0 && token < shard.vocab_size, "accepted a token outside the vocabulary");
  return 0;
}
