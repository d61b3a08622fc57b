// The text form of instructions (schedule.h): to_string and its inverse, parse_instruction
// and parse_schedule. One table of forms drives both directions, so that what prints parses.
#include "schedule/schedule.h"

#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace oases::schedule {
namespace {

// The fields of an Instruction, in the order of its declaration (the order in which fields
// outside an op's form print).
enum class Field : std::uint8_t {
  segment,
  stage,
  direction,
  micro_batch,
  sub_batch,
  sets,
  replay,
  input_only,
  chunk,
  bucket,
  payload,
  peer,
  slot,
  batch,
  encoding,
};
constexpr std::array<Field, 15> kAllFields{
    Field::segment, Field::stage,  Field::direction, Field::micro_batch, Field::sub_batch,
    Field::sets,    Field::replay, Field::input_only, Field::chunk,      Field::bucket,
    Field::payload, Field::peer,   Field::slot,       Field::batch,      Field::encoding,
};

// Integer fields print as `key=value`; the others as a bare word (a flag, or an enum's value).
struct IntegerField {
  Field field;
  std::string_view key;
  int Instruction::*member;
};
constexpr std::array<IntegerField, 9> kIntegerFields{{
    {Field::segment, "seg", &Instruction::segment},
    {Field::stage, "stage", &Instruction::stage},
    {Field::micro_batch, "mb", &Instruction::micro_batch},
    {Field::sub_batch, "sb", &Instruction::sub_batch},
    {Field::chunk, "chunk", &Instruction::chunk},
    {Field::bucket, "bucket", &Instruction::bucket},
    {Field::peer, "peer", &Instruction::peer},
    {Field::slot, "slot", &Instruction::slot},
    {Field::batch, "batch", &Instruction::batch},
}};
const IntegerField* integer_field(Field field) {
  for (const IntegerField& f : kIntegerFields)
    if (f.field == field) return &f;
  return nullptr;
}

constexpr std::array<std::pair<ops::TensorSet, std::string_view>, 4> kSetNames{{
    {ops::kCheckpoint, "checkpoint"},
    {ops::kInternals, "internals"},
    {ops::kCore, "core"},
    {ops::kOutput, "output"},
}};
constexpr std::array<ops::ActivationEncoding, 2> kEncodings{ops::ActivationEncoding::bf16,
                                                            ops::ActivationEncoding::fp8_e4m3};

// One field of an op's form: printed always (and then required by the parser), or only when it
// is not at the op's default.
struct FormField {
  Field field;
  bool always;
};
// How an op prints: its name, then its form's fields in order; fields outside the form follow,
// each only when not at the op's default (so that instructions print alike exactly when they
// are equal). An op whose text has no field prints its name alone.
struct Form {
  Op op;
  std::string_view name;
  std::vector<FormField> fields;
};

const std::vector<Form>& forms() {
  constexpr FormField seg{Field::segment, true}, mb{Field::micro_batch, true},
      sb{Field::sub_batch, true}, sets{Field::sets, true}, chunk{Field::chunk, false},
      batch{Field::batch, false};
  const std::vector<FormField> instance{seg, mb, sb, chunk, batch};
  const std::vector<FormField> with_sets{seg, sets, mb, sb, chunk, batch};
  const std::vector<FormField> collective{{Field::direction, true}, seg, mb, sb,
                                          {Field::replay, false}, chunk, batch};
  const std::vector<FormField> message{{Field::payload, true}, seg, mb, sb,
                                       {Field::peer, true}, {Field::slot, true}, chunk, batch};
  const std::vector<FormField> coded{seg, sets, mb, sb, {Field::encoding, true}, chunk, batch};
  const std::vector<FormField> bucket{{Field::bucket, true}, chunk, batch};
  static const std::vector<Form> table{
      {Op::forward, "Forward", instance},
      {Op::recompute, "Recompute", with_sets},
      {Op::backward,
       "Backward",
       {seg, {Field::stage, true}, mb, sb, {Field::input_only, false}, chunk, batch}},
      {Op::backward_weight, "BackwardWeight", instance},
      {Op::start, "Start", collective},
      {Op::wait, "Wait", collective},
      {Op::free, "Free", with_sets},
      {Op::reduce_grads, "ReduceGrads", bucket},
      {Op::optimizer_step, "OptimizerStep", {chunk, batch}},
      {Op::send, "Send", message},
      {Op::recv, "RecvStart", message},
      {Op::recv_wait, "RecvWait", message},
      {Op::use_weights, "UseWeights", {{Field::batch, true}, chunk}},
      {Op::encode, "Encode", coded},
      {Op::decode, "Decode", coded},
      {Op::gather_params, "GatherParams", bucket},
      {Op::wait_params, "WaitParams", bucket},
      {Op::release_params, "ReleaseParams", bucket},
      {Op::partition, "Partition", with_sets},
      {Op::gather_sets, "GatherSets", with_sets},
      {Op::wait_sets, "WaitSets", with_sets},
  };
  return table;
}

const Form& form_of(Op op) {
  const std::vector<Form>& table = forms();
  const auto form = std::find_if(table.begin(), table.end(),
                                 [&](const Form& candidate) { return candidate.op == op; });
  OASES_ASSERT(form != table.end(), "no text form for op {}", static_cast<int>(op));
  return *form;
}

// The instruction of `op` with every field at its default: Instruction's defaults, except that
// a Backward names the backward direction, as the generators build it.
Instruction blank(Op op) {
  Instruction ins{op};
  if (op == Op::backward) ins.direction = Direction::backward;
  return ins;
}

bool equal_in(const Instruction& a, const Instruction& b, Field field) {
  if (const IntegerField* f = integer_field(field)) return a.*(f->member) == b.*(f->member);
  switch (field) {
    case Field::direction: return a.direction == b.direction;
    case Field::sets: return a.sets == b.sets;
    case Field::replay: return a.replay == b.replay;
    case Field::input_only: return a.input_only == b.input_only;
    case Field::payload: return a.payload == b.payload;
    case Field::encoding: return a.encoding == b.encoding;
    default: return true;
  }
}

std::string field_text(const Instruction& ins, Field field) {
  if (const IntegerField* f = integer_field(field))
    return fmt::format("{}={}", f->key, ins.*(f->member));
  switch (field) {
    case Field::direction: return ins.direction == Direction::forward ? "fwd" : "bwd";
    case Field::sets: return ops::tensor_sets_name(ins.sets);
    case Field::replay: return "replay";
    case Field::input_only: return "input-only";
    case Field::payload: return std::string(name(ins.payload));
    case Field::encoding: return ops::encoding_name(ins.encoding);
    default: return "?";
  }
}

bool in_form(const Form& form, Field field) {
  for (const FormField& f : form.fields)
    if (f.field == field) return true;
  return false;
}

// How a field is written, for error messages: "seg=N", "fwd|bwd", "SETS", "replay".
std::string placeholder(Field field) {
  if (const IntegerField* integer = integer_field(field)) return fmt::format("{}=N", integer->key);
  switch (field) {
    case Field::direction: return "fwd|bwd";
    case Field::payload: return "activation|gradient";
    case Field::encoding: return "bf16|fp8";
    case Field::sets: return "SETS";
    case Field::replay: return "replay";
    case Field::input_only: return "input-only";
    default: return "?";
  }
}

// How the op is written, for error messages: "Start(fwd|bwd, seg=N, mb=N, sb=N[, replay]...)".
std::string usage(const Form& form) {
  std::string args;
  for (const FormField& f : form.fields) {
    const std::string text = placeholder(f.field);
    if (f.always) args += fmt::format("{}{}", args.empty() ? "" : ", ", text);
    else args += fmt::format("[{}{}]", args.empty() ? "" : ", ", text);
  }
  return args.empty() ? std::string(form.name) : fmt::format("{}({})", form.name, args);
}

// ---- Parsing.

// What is being parsed, as errors name it: a line of a schedule's text as written, comment
// included (line >= 1), or one instruction's text (line 0).
struct Source {
  std::string_view text;
  int line = 0;
};

[[noreturn]] void reject(const Source& source, std::string_view what) {
  if (source.line > 0)
    OASES_FAIL("schedule text line {} (\"{}\"): {}", source.line, source.text, what);
  OASES_FAIL("instruction text \"{}\": {}", source.text, what);
}

std::string_view trimmed(std::string_view text) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

std::string valid_op_names() {
  std::string names;
  for (const Form& form : forms()) names += fmt::format("{}{}", names.empty() ? "" : ", ", form.name);
  return names;
}

std::string valid_fields() {
  std::string keys;
  for (const IntegerField& f : kIntegerFields) keys += fmt::format("{}{}=N", keys.empty() ? "" : ", ", f.key);
  return fmt::format("{}; the words fwd, bwd, replay, input-only, activation, gradient, bf16, fp8; "
                     "and SETS: checkpoint, internals, core, output joined by '|', or - for none",
                     keys);
}

// A SETS word ("checkpoint|internals", "-"), or nothing when `word` is not one.
std::optional<ops::TensorSets> parse_sets(std::string_view word) {
  if (word == "-") return ops::TensorSets{0};
  ops::TensorSets sets = 0;
  while (true) {
    const std::size_t bar = word.find('|');
    const std::string_view part = word.substr(0, bar);
    bool known = false;
    for (const auto& [set, set_name] : kSetNames)
      if (part == set_name && !(sets & set)) {
        sets |= set;
        known = true;
      }
    if (!known) return std::nullopt;
    if (bar == std::string_view::npos) return sets;
    word.remove_prefix(bar + 1);
  }
}

// Sets the field a bare word names and returns it, or rejects the word.
Field apply_word(const Source& source, const Form& form, std::string_view word, Instruction& ins) {
  if (word == "fwd" || word == "bwd") {
    ins.direction = word == "fwd" ? Direction::forward : Direction::backward;
    return Field::direction;
  }
  if (word == "replay") {
    ins.replay = true;
    return Field::replay;
  }
  if (word == "input-only") {
    ins.input_only = true;
    return Field::input_only;
  }
  for (Payload payload : {Payload::activation, Payload::gradient})
    if (word == name(payload)) {
      ins.payload = payload;
      return Field::payload;
    }
  for (ops::ActivationEncoding encoding : kEncodings)
    if (word == ops::encoding_name(encoding)) {
      ins.encoding = encoding;
      return Field::encoding;
    }
  if (const std::optional<ops::TensorSets> sets = parse_sets(word)) {
    ins.sets = *sets;
    return Field::sets;
  }
  reject(source, fmt::format("\"{}\" is neither a key=value field nor a known word; expected {} "
                             "(fields: {})",
                             word, usage(form), valid_fields()));
}

// Sets the field a `key=value` argument names and returns it, or rejects the argument.
Field apply_key_value(const Source& source, const Form& form, std::string_view key,
                      std::string_view value, Instruction& ins) {
  for (const IntegerField& f : kIntegerFields) {
    if (key != f.key) continue;
    int number = 0;
    const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
    if (value.empty() || error != std::errc{} || end != value.data() + value.size())
      reject(source, fmt::format("{}={}: the value of {} must be an integer", key, value, key));
    ins.*(f.member) = number;
    return f.field;
  }
  reject(source, fmt::format("\"{}\" is not a field; expected {} (fields: {})", key, usage(form),
                             valid_fields()));
}

// The arguments between the parentheses, split at commas and trimmed.
std::vector<std::string_view> arguments(const Source& source, std::string_view inside) {
  std::vector<std::string_view> out;
  if (trimmed(inside).empty()) return out;
  while (true) {
    const std::size_t comma = inside.find(',');
    const std::string_view argument = trimmed(inside.substr(0, comma));
    if (argument.empty()) reject(source, "an empty argument between commas");
    out.push_back(argument);
    if (comma == std::string_view::npos) return out;
    inside.remove_prefix(comma + 1);
  }
}

// The instruction `code` (its source's text without a comment) spells.
Instruction parse(const Source& source, std::string_view code) {
  const std::string_view text = trimmed(code);
  if (text.empty()) reject(source, fmt::format("no instruction; valid: {}", valid_op_names()));
  const std::size_t open = text.find('(');
  const std::string_view op_name = trimmed(text.substr(0, open));
  const Form* form = nullptr;
  for (const Form& candidate : forms())
    if (candidate.name == op_name) form = &candidate;
  if (form == nullptr)
    reject(source, fmt::format("\"{}\" is not an instruction; valid: {}", op_name,
                               valid_op_names()));
  std::string_view inside;
  if (open != std::string_view::npos) {
    if (text.back() != ')')
      reject(source, fmt::format("expected a closing parenthesis at the end, as in {}",
                                 usage(*form)));
    inside = text.substr(open + 1, text.size() - open - 2);
    if (inside.find_first_of("()") != std::string_view::npos)
      reject(source, fmt::format("unexpected parenthesis; expected {}", usage(*form)));
  }
  Instruction ins = blank(form->op);
  std::vector<Field> seen;
  for (const std::string_view argument : arguments(source, inside)) {
    const std::size_t equals = argument.find('=');
    const Field field =
        equals == std::string_view::npos
            ? apply_word(source, *form, argument, ins)
            : apply_key_value(source, *form, trimmed(argument.substr(0, equals)),
                              trimmed(argument.substr(equals + 1)), ins);
    if (std::find(seen.begin(), seen.end(), field) != seen.end())
      reject(source, fmt::format("\"{}\" sets {} a second time; expected {}", argument,
                                 placeholder(field), usage(*form)));
    seen.push_back(field);
  }
  for (const FormField& f : form->fields)
    if (f.always && std::find(seen.begin(), seen.end(), f.field) == seen.end())
      reject(source, fmt::format("{} needs {}; expected {}", form->name, placeholder(f.field),
                                 usage(*form)));
  return ins;
}

}  // namespace

std::string to_string(const Instruction& ins) {
  const Form& form = form_of(ins.op);
  const Instruction defaults = blank(ins.op);
  std::vector<std::string> args;
  for (const FormField& f : form.fields) {
    // UseWeights prints its chunk beside any batch but 0, as its text always has.
    const bool chunk_of_use_weights =
        ins.op == Op::use_weights && f.field == Field::chunk && ins.batch != 0;
    if (f.always || chunk_of_use_weights || !equal_in(ins, defaults, f.field))
      args.push_back(field_text(ins, f.field));
  }
  for (const Field field : kAllFields)
    if (!in_form(form, field) && !equal_in(ins, defaults, field))
      args.push_back(field_text(ins, field));
  if (args.empty()) return std::string(form.name);
  return fmt::format("{}({})", form.name, fmt::join(args, ", "));
}

std::string to_string(const Schedule& schedule) {
  std::string out;
  for (const Instruction& ins : schedule) out += to_string(ins) + "\n";
  return out;
}

Instruction parse_instruction(std::string_view text) {
  return parse({trimmed(text), 0}, text);
}

Schedule parse_schedule(std::string_view text) {
  Schedule out;
  int line_number = 0;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    ++line_number;
    const std::string_view code = trimmed(line.substr(0, line.find('#')));
    if (code.empty()) continue;
    out.push_back(parse({trimmed(line), line_number}, code));
  }
  return out;
}

}  // namespace oases::schedule
