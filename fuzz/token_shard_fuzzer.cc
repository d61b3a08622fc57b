// libFuzzer target: data::load_token_shard on arbitrary file contents.
//
// An accepted shard must match data/token_shard.h: the file is exactly the header (48 bytes in
// version 2, 44 in version 1) plus count x width bytes, the width is 2 or 4 and holds the vocabulary, the tokenizer name
// is 1 to 16 printable characters, and every token lies in [0, vocab_size).
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
  require(shard.version == 1 || shard.version == 2, "accepted a format version not 1 or 2");
  const std::size_t header = shard.version == 1 ? oases::data::kTokenShardV1HeaderBytes
                                                : oases::data::kTokenShardHeaderBytes;
  require(size == header + shard.tokens.size() * shard.token_width,
          "accepted a file whose size is not header + count x width");
  require(shard.vocab_size >= 1 &&
              shard.vocab_size <= (shard.token_width == 2 ? 65536 : std::int64_t{1} << 31),
          "accepted a vocabulary its token width cannot hold");
  require(!shard.tokenizer.empty() && shard.tokenizer.size() <= oases::data::kTokenShardNameBytes,
          "accepted an empty or over-long tokenizer name");
  for (const std::int32_t token : shard.tokens)
    require(token >= 0 && token < shard.vocab_size, "accepted a token outside the vocabulary");
  return 0;
}
