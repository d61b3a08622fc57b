// The reference for tests/data/chat_template_test.cc: renders chat templates with the npm
// package @huggingface/jinja (the JavaScript Jinja that Hugging Face uses for chat templates,
// configured as transformers' apply_chat_template: trim_blocks and lstrip_blocks on).
//   node jinja_reference.js PACKAGE_DIR CASES_FILE
// PACKAGE_DIR is the package's folder (node_modules/@huggingface/jinja). CASES_FILE holds
//   {"templates": {NAME: TEXT, ...}, "cases": [{"template": NAME, "variables": {...}}, ...]}
// and the script prints one JSON list on stdout, an entry per case in order: {"output": TEXT}
// when the template rendered, {"error": MESSAGE} when parsing or rendering threw.
'use strict';
const fs = require('fs');
const path = require('path');

const [packageDir, casesFile] = process.argv.slice(2);
const { Template } = require(path.resolve(packageDir));
const { templates, cases } = JSON.parse(fs.readFileSync(casesFile, 'utf8'));

const parsed = new Map();
const results = cases.map(({ template, variables }) => {
  try {
    if (!parsed.has(template)) parsed.set(template, new Template(templates[template]));
    return { output: parsed.get(template).render(variables) };
  } catch (error) {
    return { error: String(error && error.message ? error.message : error) };
  }
});
process.stdout.write(JSON.stringify(results) + '\n');
