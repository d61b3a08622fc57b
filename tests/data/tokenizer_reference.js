// The references of tests/data/{bpe,wordpiece,sentencepiece}_tokenizer_test.cc and
// tokenizer_folder_test.cc: independent JavaScript tokenizers from npm, and the mixed text they
// are compared on.
//   node tokenizer_reference.js text OUT_FILE BYTES SPECIALS
//       writes at least BYTES bytes of mixed UTF-8 text to OUT_FILE (the same text every time:
//       the fortunes of Debian's `fortunes` package when installed, then generated text mixing
//       English, code, accents, Cyrillic, Greek, CJK, Korean, Devanagari, Arabic, Thai, emoji,
//       numbers of several scripts, whitespace runs, upper-case contractions, punctuation and
//       control characters). SPECIALS is a comma-separated list of special tokens sprinkled in
//       ("" for none).
//   node tokenizer_reference.js llama3 NODE_MODULES TEXT_FILE
//       ids of llama3-tokenizer-js (LLaMA 3; no <|begin_of_text|> or <|end_of_text|> added; its
//       special tokens in the text become their ids)
//   node tokenizer_reference.js llama2 NODE_MODULES TEXT_FILE
//       ids of llama-tokenizer-js (LLaMA 2; no <s>; the dummy space before the text)
//   node tokenizer_reference.js hf NODE_MODULES FOLDER TEXT_FILE
//       ids of @huggingface/tokenizers (Tokenizers.js) for FOLDER's tokenizer.json and
//       tokenizer_config.json, without the post-processor's special tokens; added tokens in
//       the text become their ids
// Ids are printed as one JSON array on stdout.
//
// The text leaves out what the JavaScript references do differently from the tokenizers they
// stand for (see the C++ tests): U+FEFF and U+0085 (JavaScript's \s differs from Unicode
// White_Space there), U+017F after an apostrophe (LLaMA 3's case-insensitive contractions),
// U+2581 (oases writes it in byte pieces, SentencePiece as a space), a capital sigma ending a
// word (Tokenizers.js lower-cases the whole text, with final-sigma context; Hugging Face's Rust
// tokenizers, and oases, map each character alone) and unassigned code points.
'use strict';
const fs = require('fs');
const path = require('path');

function validUtf8(buffer) {
  try {
    new TextDecoder('utf-8', { fatal: true }).decode(buffer);
    return true;
  } catch (e) {
    return false;
  }
}

// A small deterministic generator (xorshift32), so the text is the same on every run.
function generator(seed) {
  let state = seed >>> 0 || 1;
  return (n) => {
    state ^= state << 13;
    state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5;
    state >>>= 0;
    return state % n;
  };
}

function mixedText(bytes, specials) {
  let text = '';
  const fortunes = '/usr/share/games/fortunes';
  if (fs.existsSync(fortunes)) {
    const files = fs.readdirSync(fortunes).filter((f) => !f.includes('.')).sort();
    for (const file of files) {
      const buffer = fs.readFileSync(path.join(fortunes, file));
      if (validUtf8(buffer)) text += buffer.toString('utf8');
      if (Buffer.byteLength(text) >= bytes / 2) break;
    }
    text = text.replace(/[\uFEFF\u0085\u017F\u2581]/gu, ' ').replace(/Σ(?!\p{L})/gu, 'σ');
  }
  const words = [
    'the', 'The', 'world', "don't", "DON'T", "I'm", "I'M", "we're", "WE'RE", "you've", "YOU'VE",
    "she'll", "SHE'LL", "he'd", "HE'D", "it's", "IT'S", "'S", "'Re", "O'Neil", "rock'n'roll",
    'café', 'naïve', 'Größe', 'señor', 'déjà', 'Ångström', 'façade', 'œuvre', 'ÉCOLE',
    'Москва', 'ПРИВЕТ', 'привет', 'Ελλάδα', 'λόγος', 'ΑΘΗΝΑ', '漢字', '日本語のテキスト',
    '中文文本', '한국어', '서울특별시', 'हिन्दी', 'नमस्ते', 'עברית', 'العربية', 'ไทย', 'Tiếng Việt',
    '😀', '👍🏽', '👨‍👩‍👧', '🇫🇷', '❤️', '∑', '→', '©', '§', '€', '123', '3.14', '1,000,000',
    '0x1F', '٣٤٥', '１２３', 'Ⅻ', '²', '½', '42nd', 'A1', 'v2.0', '12345678901234', '...', '!?',
    '--', '«»', '“quoted”', '(paren)', '[x]', '{y}', 'a_b', 'foo.bar()', 'http://example.com/a?b=c',
    '#tag', '@user', "'", "''", '"', '’s', '\x01', '\x7F', '\x1C',
    'int main(int argc, char** argv) {', 'return 0;', '}', 'for (i = 0; i < n; ++i)',
    'def f(x):', 'if x >= 10 and not y:', 'print(f"{x!r}")', 'std::vector<int> v;', '=>',
    '&&', '||', '/* comment */', '// note', '<div class="a">', '</div>', 'SELECT * FROM t;',
    'HTTP/1.1 200 OK', 'ÀÉÎÕÜ', 'İstanbul', 'ǅ', 'ﬁ', 'Ⓐ',
  ];
  const spaces = [' ', ' ', ' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n ', '\u00A0',
                  '\u3000', '\u2003', '\n\n\n    ', '\t\t', '    ', '', ''];
  const next = generator(2024);
  let generated = '';
  while (Buffer.byteLength(text) + generated.length * 2 < bytes * 1.1) {
    if (specials.length > 0 && next(40) === 0) generated += specials[next(specials.length)];
    generated += words[next(words.length)];
    generated += spaces[next(spaces.length)];
  }
  text += generated;
  while (Buffer.byteLength(text) < bytes) text += words[next(words.length)] + ' ';
  return text;
}

async function main() {
  const [command, ...args] = process.argv.slice(2);
  if (command === 'text') {
    const [out, bytes, specials] = args;
    fs.writeFileSync(out, mixedText(Number(bytes), specials ? specials.split(',') : []));
    return;
  }
  let ids;
  if (command === 'llama3') {
    const [modules, textFile] = args;
    const module = await import(path.join(
      modules, 'llama3-tokenizer-js', 'bundle', 'llama3-tokenizer-with-baked-data.js'));
    ids = module.default.encode(fs.readFileSync(textFile, 'utf8'), { bos: false, eos: false });
  } else if (command === 'llama2') {
    const [modules, textFile] = args;
    const module = await import(path.join(modules, 'llama-tokenizer-js', 'llama-tokenizer.js'));
    const tokenizer = new module.LlamaTokenizer();
    ids = tokenizer.encode(fs.readFileSync(textFile, 'utf8'), false, true);
  } else if (command === 'hf') {
    const [modules, folder, textFile] = args;
    const { Tokenizer } = await import(
      path.join(modules, '@huggingface', 'tokenizers', 'dist', 'tokenizers.mjs'));
    const json = JSON.parse(fs.readFileSync(path.join(folder, 'tokenizer.json'), 'utf8'));
    const configFile = path.join(folder, 'tokenizer_config.json');
    const config = fs.existsSync(configFile) ? JSON.parse(fs.readFileSync(configFile, 'utf8')) : {};
    const tokenizer = new Tokenizer(json, config);
    ids = tokenizer.encode(fs.readFileSync(textFile, 'utf8'), { add_special_tokens: false }).ids;
  } else {
    throw new Error(`unknown command '${command}'`);
  }
  process.stdout.write(JSON.stringify(ids) + '\n');
}

main().catch((error) => {
  process.stderr.write(`tokenizer_reference.js: ${error.stack || error}\n`);
  process.exit(1);
});
