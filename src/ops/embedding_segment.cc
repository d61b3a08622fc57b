#include "ops/embedding_segment.h"

#include <string>
#include <utility>
#include <vector>

namespace oases::ops {
namespace {

class EmbeddingSegment final : public Segment {
 public:
  EmbeddingSegment(int id, const ModelContext& model, EmbeddingSpec spec)
      : Segment(id, *model.store),
        m_(model),
        spec_(std::move(spec)),
        type_ids_(static_cast<std::size_t>(model.tokens()), 0) {}
  const std::string& name() const override { return name_; }
  SegmentShape shape() const override {
    SegmentShape shape;
    shape.name = name_;
    shape.has_forward_collective = true;
    shape.forward_kind = reduction();
    shape.sequence_sharded = m_.sequence_parallel;
    shape.collective_ranks = m_.tp_size();
    shape.degree = m_.tp_size();
    shape.forward_collective_elements = m_.tokens() * m_.hidden;
    // Forward reads a word row (and a position row) per token and writes the output; backward
    // reads the output's gradient and adds it into the tables' rows.
    const double rows = static_cast<double>(m_.tokens() * m_.hidden) *
                        static_cast<double>(dtype_size(m_.dtype));
    shape.work.known = true;
    shape.work.checkpoint.bytes = 3 * rows;
    shape.work.backward_input = {Work{{}, 5 * rows}};
    return shape;
  }

  void forward(const StepContext& ctx, int mb, int sb) override {
    const Tensor out = m_.slot(Slot::output, mb, sb);
    const bool adds_once = m_.tp_rank() == 0;
    const Tensor positions = adds_once ? spec_.positions.value : Tensor();
    for_each_chunk([&](std::int64_t first, std::int64_t count, std::int64_t rows,
                       std::int64_t position) {
      kernels::embedding_forward(tokens(ctx, mb, sb) + first, spec_.word.value,
                                 positions_from(positions, position, count),
                                 out.rows(first, first + rows * count), rows, count, spec_.vocab);
    });
    if (adds_once && spec_.token_types.present())
      kernels::embedding_accumulate(type_ids_.data(), spec_.token_types.value, out, m_.rows,
                                    m_.seq_len);
  }
  void backward(const StepContext& ctx, int mb, int sb, int) override {
    const Tensor d_out = m_.slot(Slot::output_grad, mb, sb);
    for_each_chunk(
        [&](std::int64_t first, std::int64_t count, std::int64_t rows, std::int64_t position) {
          kernels::embedding_backward(
              d_out.rows(first, first + rows * count), tokens(ctx, mb, sb) + first, spec_.word.grad,
              positions_from(spec_.positions.grad, position, count), rows, count, spec_.vocab);
        });
    if (spec_.token_types.present())
      kernels::embedding_accumulate_backward(d_out, type_ids_.data(), spec_.token_types.grad,
                                             m_.rows, m_.seq_len);
  }
  CollectiveCall forward_collective(int mb, int sb) override {
    return {reduction(), comm::ReduceOp::sum, m_.tp, m_.slot(Slot::output, mb, sb), {}};
  }

 private:
  // Under sequence parallelism each rank keeps its block of the tokens: the first layer's shard
  // segment reads it, and its backward all-gathers the output's gradient back.
  CollectiveKind reduction() const { return partial_sum_collective(m_.sequence_parallel); }
  // Calls run(first token, tokens per sequence, sequences, first position) over the sub-batch:
  // once for all of it, or under context parallelism once per sequence and chunk (whose
  // positions are those of the chunk in its sequence).
  template <class Run>
  void for_each_chunk(const Run& run) const {
    if (m_.cp_size() == 1) return run(std::int64_t{0}, m_.seq_len, m_.rows, std::int64_t{0});
    const std::int64_t chunk = m_.chunk_len();
    for (std::int64_t row = 0; row < m_.rows; ++row)
      for (std::int64_t local = 0; local < m_.seq_len; local += chunk)
        run(row * m_.seq_len + local, chunk, std::int64_t{1}, m_.position(local));
  }
  // The rows of a position table from `position` on (empty stays empty).
  static Tensor positions_from(const Tensor& table, std::int64_t position, std::int64_t count) {
    return table.empty() ? table : table.rows(position, position + count);
  }
  const std::int32_t* tokens(const StepContext& ctx, int mb, int sb) const {
    return ctx.micro_batches[static_cast<std::size_t>(mb)].inputs + sb * m_.tokens();
  }

  const ModelContext& m_;
  EmbeddingSpec spec_;
  std::vector<std::int32_t> type_ids_;  // all 0: the data carries no token types
  std::string name_ = "embedding";
};

}  // namespace

std::unique_ptr<Segment> make_embedding_segment(int id, const ModelContext& model,
                                                EmbeddingSpec spec) {
  return std::make_unique<EmbeddingSegment>(id, model, std::move(spec));
}

}  // namespace oases::ops
