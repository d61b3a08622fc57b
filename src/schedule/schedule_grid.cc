#include "schedule/schedule_grid.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <set>

namespace oases::schedule {
namespace {

constexpr std::size_t kMaxCell = 14;  // characters of a cell, its ~ included where cut

std::string sets_letters(ops::TensorSets sets) {
  constexpr std::array<std::pair<ops::TensorSet, char>, 4> kLetters{{
      {ops::kCheckpoint, 'c'}, {ops::kInternals, 'i'}, {ops::kCore, 'k'}, {ops::kOutput, 'o'}}};
  std::string out;
  for (const auto& [set, letter] : kLetters)
    if (sets & set) out += letter;
  return out.empty() ? "-" : out;
}

std::string instance_of(const Instruction& ins) {
  return fmt::format("{}.{}.{}", ins.segment, ins.micro_batch, ins.sub_batch);
}

std::string with_sets(std::string_view prefix, const Instruction& ins) {
  return fmt::format("{}{}:{}", prefix, instance_of(ins), sets_letters(ins.sets));
}

// Which of an instance's collectives a Start or Wait names: f, b, or r (the replayed forward).
char collective_letter(const Instruction& ins) {
  if (ins.direction == Direction::backward) return 'b';
  return ins.replay ? 'r' : 'f';
}

char payload_letter(const Instruction& ins) {
  return ins.payload == Payload::activation ? 'a' : 'g';
}

std::string batch_suffix(int batch) {
  if (batch == 0) return "";
  return batch == -1 ? "'" : fmt::format("'{}", batch);
}

// The compact form without the batch suffix.
std::string compact_body(const Instruction& ins) {
  switch (ins.op) {
    case Op::forward: return fmt::format("F{}", instance_of(ins));
    case Op::recompute: return with_sets("R", ins);
    case Op::backward:
      return fmt::format("{}{}/{}", ins.input_only ? 'I' : 'B', instance_of(ins), ins.stage);
    case Op::backward_weight: return fmt::format("W{}", instance_of(ins));
    case Op::start:
    case Op::wait:
      return fmt::format("{}{}{}", ins.op == Op::start ? 's' : 'w', collective_letter(ins),
                         instance_of(ins));
    case Op::free: return with_sets("x", ins);
    case Op::encode: return with_sets("e", ins);
    case Op::decode: return with_sets("d", ins);
    case Op::partition: return with_sets("pt", ins);
    case Op::gather_sets: return with_sets("gs", ins);
    case Op::wait_sets: return with_sets("ws", ins);
    case Op::gather_params: return fmt::format("gp{}", ins.bucket);
    case Op::wait_params: return fmt::format("wp{}", ins.bucket);
    case Op::release_params: return fmt::format("rp{}", ins.bucket);
    case Op::reduce_grads: return fmt::format("rg{}", ins.bucket);
    case Op::optimizer_step: return "step";
    case Op::use_weights: return fmt::format("uw{}", ins.batch);
    case Op::send:
      return fmt::format("{}{}>{}", payload_letter(ins), instance_of(ins), ins.peer);
    case Op::recv:
    case Op::recv_wait:
      return fmt::format("{}{}{}<{}", ins.op == Op::recv ? 's' : 'w', payload_letter(ins),
                         instance_of(ins), ins.peer);
  }
  return "?";
}

std::string cut(std::string cell) {
  if (cell.size() > kMaxCell) cell = cell.substr(0, kMaxCell - 1) + "~";
  return cell;
}

// The rows a grid shows, in order: every row without marks, else those within `context` of a
// marked one (mark rows already clamped to their column's end).
std::vector<std::size_t> shown_rows(std::size_t rows, const std::vector<GridMark>& marks,
                                    std::size_t context) {
  std::vector<std::size_t> out;
  if (marks.empty()) {
    for (std::size_t row = 0; row < rows; ++row) out.push_back(row);
    return out;
  }
  std::set<std::size_t> chosen;
  for (const GridMark& mark : marks)
    for (std::size_t row = mark.row > context ? mark.row - context : 0;
         row <= mark.row + context && row < rows; ++row)
      chosen.insert(row);
  return {chosen.begin(), chosen.end()};
}

// The columns a grid shows, in order: all of them without marks, else the marked ones and then
// the nearest others while the lines stay within `room` characters (each column takes its
// width and 3).
std::vector<std::size_t> shown_columns(const std::vector<std::size_t>& widths,
                                       const std::vector<GridMark>& marks, std::size_t room) {
  std::vector<std::size_t> order(widths.size());
  for (std::size_t c = 0; c < order.size(); ++c) order[c] = c;
  if (marks.empty()) return order;
  const auto distance = [&](std::size_t column) {
    std::size_t nearest = widths.size();
    for (const GridMark& mark : marks)
      nearest = std::min(nearest, column > mark.column ? column - mark.column : mark.column - column);
    return nearest;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return distance(a) < distance(b); });
  std::vector<std::size_t> out;
  std::size_t used = 0;
  for (const std::size_t column : order) {
    const std::size_t cost = widths[column] + 3;
    if (!out.empty() && distance(column) > 0 && used + cost > room) break;
    out.push_back(column);
    used += cost;
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string without_trailing_spaces(std::string line) {
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line + "\n";
}

// The grid's cells and layout, computed before any line is drawn.
struct Layout {
  std::vector<std::string> names;  // per column
  std::vector<std::size_t> rows;   // shown, in order
  std::vector<std::size_t> columns;  // shown, in order
  std::vector<std::size_t> widths;   // per column
  std::size_t label_width = 0;
  std::size_t real_rows = 0;  // rows at or past this are labelled end
};

std::string cell_text(const std::vector<Schedule>& columns, std::size_t column, std::size_t row,
                      bool marked) {
  const Schedule& schedule = columns[column];
  if (row < schedule.size()) return cut(compact_string(schedule[row]));
  return marked && row == schedule.size() ? "end" : "";
}

std::string draw_row(const std::vector<Schedule>& columns, const std::vector<GridMark>& marks,
                     const Layout& layout, std::size_t row) {
  const auto marked = [&](std::size_t column) {
    return std::any_of(marks.begin(), marks.end(), [&](const GridMark& mark) {
      return mark.column == column && mark.row == row;
    });
  };
  bool any = false;
  std::string cells;
  for (const std::size_t column : layout.columns) {
    const bool mark = marked(column);
    any = any || mark;
    const std::string text = cell_text(columns, column, row, mark);
    const std::string cell = mark ? fmt::format("[{}]", text) : fmt::format(" {} ", text);
    cells += fmt::format(" {:<{}}", cell, layout.widths[column] + 2);
  }
  const std::string label = row < layout.real_rows ? std::to_string(row) : "end";
  return without_trailing_spaces(
      fmt::format("{} {:>{}}{}", any ? '>' : ' ', label, layout.label_width, cells));
}

}  // namespace

std::string compact_string(const Instruction& ins) {
  return compact_body(ins) + (ins.op == Op::use_weights ? "" : batch_suffix(ins.batch));
}

std::string format_grid(const std::vector<Schedule>& columns, const std::vector<GridMark>& marks,
                        const GridOptions& options) {
  Layout layout;
  for (std::size_t c = 0; c < columns.size(); ++c)
    layout.names.push_back(c < options.column_names.size() ? options.column_names[c]
                                                            : fmt::format("rank {}", c));
  // Marks past a column's last instruction mark its end, one row after it.
  std::vector<GridMark> clamped;
  for (const GridMark& mark : marks)
    if (mark.column < columns.size())
      clamped.push_back({mark.column, std::min(mark.row, columns[mark.column].size())});
  std::size_t rows = 0;
  for (const Schedule& schedule : columns) rows = std::max(rows, schedule.size());
  layout.real_rows = rows;
  for (const GridMark& mark : clamped) rows = std::max(rows, mark.row + 1);
  layout.rows = shown_rows(rows, clamped, options.context);
  layout.label_width = std::max<std::size_t>({options.row_name.size(), 3,
                                              std::to_string(rows).size()});
  for (std::size_t c = 0; c < columns.size(); ++c) {
    std::size_t width = layout.names[c].size();
    for (const std::size_t row : layout.rows)
      width = std::max(width, cell_text(columns, c, row, true).size());
    layout.widths.push_back(width);
  }
  const std::size_t label = layout.label_width + 2;
  layout.columns = shown_columns(layout.widths, clamped,
                                 options.width > label ? options.width - label : 0);
  std::string out = fmt::format("  {:>{}}", options.row_name, layout.label_width);
  for (const std::size_t c : layout.columns)
    out += fmt::format("  {:<{}} ", layout.names[c], layout.widths[c]);
  out = without_trailing_spaces(out);
  const std::string gap = fmt::format("  {:>{}}\n", "...", layout.label_width);
  for (std::size_t i = 0; i < layout.rows.size(); ++i) {
    if (layout.rows[i] != (i == 0 ? 0 : layout.rows[i - 1] + 1)) out += gap;
    out += draw_row(columns, clamped, layout, layout.rows[i]);
  }
  if (!layout.rows.empty() && layout.rows.back() + 1 < rows) out += gap;
  if (layout.columns.size() < columns.size())
    out += fmt::format("({} of {} columns left out)\n", columns.size() - layout.columns.size(),
                       columns.size());
  return out;
}

}  // namespace oases::schedule
