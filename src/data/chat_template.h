// Chat templates: the Jinja programs Hugging Face model folders ship (tokenizer_config.json's
// "chat_template", or chat_template.jinja) that turn a conversation into the exact text a chat
// model was trained on, and the cut of that text into the parts a model should learn (the
// assistant's replies) and the parts it only reads (everything else).
//
// The interpreter implements the subset of Jinja that chat templates use, configured as
// transformers' apply_chat_template configures Jinja2: trim_blocks and lstrip_blocks on, the
// template's single trailing newline dropped, undefined variables lenient. Behaviour follows
// @huggingface/jinja 0.5.13 (the JavaScript reimplementation tests compare against) except
// where noted below.
//
// Supported:
//  - Tags: {{ expression }}, {% statement %}, {# comment #}, with "-" on either side to strip
//    the whitespace next to the tag ({%- -%} {{- -}} {#- -#}). trim_blocks: the first newline
//    after %} or #} is dropped; lstrip_blocks: spaces and tabs between the start of a line and
//    {% or {# are dropped.
//  - Statements: if/elif/else/endif; for/else/endfor, over lists, dict keys, strings
//    (characters) and undefined (no iterations), with tuple unpacking (for k, v in d.items()),
//    a filtering condition (for m in messages if m.role != 'system'), break, continue, and
//    `loop` (index, index0, revindex, revindex0, first, last, length, previtem, nextitem); set
//    (a name, a tuple of names, a namespace attribute, or a block: set x %}...{% endset);
//    macro/endmacro (positional and keyword parameters with defaults; no caller or varargs);
//    generation/endgeneration (transformers' marker of assistant text: renders its body; its
//    tags are ordinary block tags for whitespace control, as in transformers).
//  - Expressions: string (with \n \t \r \b \f \v \' \" \\ \xHH \uHHHH escapes; adjacent
//    literals join), integer, float, true/false/none (also True/False/None), list, tuple and
//    dict literals; attribute and subscript access, negative indices, slices [a:b:c];
//    + - * / // % ** ~, unary - +, comparisons, and/or/not, in/not in, `is [not] test`,
//    x if c else y (without else: undefined when c is false), calls.
//  - Tests: defined, undefined, none, string, number, integer, boolean, true, false, mapping,
//    iterable, sequence, callable, odd, even, lower, upper, equalto/eq/ne/in (`is equalto(x)`).
//  - Filters: trim, upper, lower, title, capitalize, length/count, tojson (indent,
//    ensure_ascii, sort_keys, separators), join, default/d (with boolean), first, last,
//    replace, string, int, float, abs, bool, list, items, reverse, sort, unique, indent,
//    safe, select/reject (by test), selectattr/rejectattr, map(attribute=...).
//  - Methods: on strings strip/lstrip/rstrip (optional characters), startswith/endswith (a
//    string or a list of them), split (sep, maxsplit), upper, lower, title, capitalize,
//    replace (with count); on dicts get, items, keys, values.
//  - Globals: raise_exception(message) (a UserError carrying the message), range,
//    namespace(...), strftime_now(format) (local time).
//
// Not supported (a template using them fails with a UserError naming the construct, line
// and column): call blocks, filter blocks, include/import/extends/block, raw, with, recursive
// loops, loop.cycle, macro caller/varargs/kwargs, string formatting (%), list methods, tests
// other than the above. Unknown filters and tests are reported when rendering reaches them, not
// when parsing, since shipped templates name unsupported filters in branches real
// conversations never take.
//
// Where @huggingface/jinja differs from Python's Jinja2, this follows @huggingface/jinja in
// how values print (true/false print as "true"/"false", none prints as nothing, lists and
// dicts print as JSON), in title and capitalize leaving the other letters of a word as they
// are, and in "+" joining a string with a number. It follows Jinja2 in the rest: lengths,
// indices and slices of strings count code points (JavaScript counts UTF-16 units); % and //
// round as in Python; dividing by zero is an error; strings compare with < >; strip and trim
// take optional characters; == compares lists and dicts by content, and undefined does not
// equal none; a float input stays a float (2.0 prints "2.0"); int("12abc") gives the default;
// {%- or {{- next to a generation tag strips only up to that tag (@huggingface/jinja deletes
// generation tags before lexing, joining the text around them). Unlike both, upper, lower,
// title and capitalize change ASCII letters only. Arithmetic, < >, method calls and filters
// other than default, tojson, string and bool on undefined or none values are errors;
// attribute and item access on them, and on missing keys, give undefined.
//
// Strings are UTF-8 bytes; text that is not valid UTF-8 passes through unchanged.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace oases::data {

// A parsed chat template. Immutable after parse(); render() is const and thread-safe.
class ChatTemplate {
 public:
  // Parses `text`. `source` names the template in error messages (a file, or "<model
  // folder>/tokenizer_config.json"). Throws UserError for a syntax error, naming the source,
  // line and column (counted in characters, from 1).
  static ChatTemplate parse(std::string_view text, std::string source);

  // Renders the template with `variables` (a JSON object: messages, bos_token, eos_token,
  // add_generation_prompt, tools, ...). Keys keep their order (it shows in tojson and items).
  // Throws UserError when rendering fails (an operation on the wrong types, an unknown
  // filter), naming the source, line and column, and when the template calls raise_exception,
  // carrying the template's message.
  std::string render(const nlohmann::ordered_json& variables) const;

  const std::string& source() const { return source_; }

  struct Program;  // the parsed template (defined in chat_template.cc)
  const Program& program() const { return *program_; }  // for render_chat

 private:
  ChatTemplate(std::shared_ptr<const Program> program, std::string source)
      : program_(std::move(program)), source_(std::move(source)) {}

  std::shared_ptr<const Program> program_;
  std::string source_;
};

// A piece of a rendered conversation. `trained`: the piece is text the model should learn to
// produce (its tokens count in the loss).
struct ChatSegment {
  std::string text;
  bool trained = false;

  bool operator==(const ChatSegment&) const = default;
};

// Renders `messages` (a JSON list of objects, each with a string "role" and usually a
// "content") with `chat_template` and cuts the text into segments. The model's turns are the
// messages whose role is "assistant".
//
// The span rule. For each message i whose role is "assistant", let
//   prompt_i = render(messages[:i], add_generation_prompt=true) and
//   turn_i   = render(messages[:i+1], add_generation_prompt=false).
// The trained text of message i is turn_i minus its prefix prompt_i: the reply and whatever the
// template writes after it (its end-of-turn marker, so that the model learns to stop), but not
// the header the generation prompt already holds. It is exactly what a model prompted with
// prompt_i must generate to produce this turn. The whole conversation is
// render(messages, add_generation_prompt=false); every prompt_i must be a prefix of turn_i,
// and every turn_i a prefix of the whole, else the template is not prefix-stable (it renders
// earlier messages differently once later ones follow, e.g. puts the system prompt into the
// last user turn or drops the reasoning of earlier replies) and this throws a UserError naming
// the template and the message. `variables` supplies the other variables (bos_token,
// eos_token, tools, ...); its "messages" and "add_generation_prompt", if any, are replaced.
//
// Guarantees: the segments concatenate to exactly render(messages, add_generation_prompt=false);
// none is empty; neighbours differ in `trained` (consecutive pieces of one kind are joined).
// Renders the template 2k+1 times for k assistant messages.
// Throws UserError when `messages` is not a list of objects with string roles (naming the
// message), when a render fails (as render() does, saying which prefix was being rendered),
// or when the template is not prefix-stable.
std::vector<ChatSegment> render_chat(const ChatTemplate& chat_template,
                                     const nlohmann::ordered_json& messages,
                                     const nlohmann::ordered_json& variables);

// The chat template of a Hugging Face model folder and the variables it expects besides the
// conversation: the text of `folder`/chat_template.jinja when present (newer transformers
// saves it there), else tokenizer_config.json's "chat_template" (a string, or a list of
// {"name", "template"} from which the one named "default" is taken); bos_token and eos_token
// from tokenizer_config.json (a string or an object with "content"), when set.
struct ModelChatTemplate {
  ChatTemplate chat_template;
  nlohmann::ordered_json variables;  // {"bos_token": ..., "eos_token": ...}
};
// Throws UserError naming the folder and file when neither file gives a template, or the JSON
// is malformed, or the template does not parse.
ModelChatTemplate load_model_chat_template(const std::string& folder);

}  // namespace oases::data
