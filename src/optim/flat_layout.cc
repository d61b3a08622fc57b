#include "optim/flat_layout.h"

#include "core/error.h"
#include "core/tensor.h"

#include <fmt/format.h>

#include <set>
#include <string_view>

namespace oases::optim {

std::int64_t ParamSlot::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

std::int64_t ParamSlot::whole_numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : whole_shape()) n *= d;
  return n;
}

std::int64_t FlatLayout::param_numel() const {
  std::int64_t n = 0;
  for (const ParamSlot& p : params) n += p.numel();
  return n;
}

void validate_layout(const FlatLayout& layout) {
  OASES_ASSERT(layout.dtype == DType::f32 || layout.dtype == DType::f64,
               "optimizer layout dtype {} has no optimizer kernels; f32 and f64 do",
               dtype_name(layout.dtype));
  OASES_ASSERT(layout.total_numel >= 0, "optimizer layout has negative size {}",
               layout.total_numel);
  std::set<std::string_view> names;
  std::int64_t previous_end = 0;
  std::string_view previous = "the start of the flat array";
  for (const ParamSlot& p : layout.params) {
    OASES_ASSERT(!p.name.empty(), "optimizer layout has a parameter without a name at offset {}",
                 p.offset);
    OASES_ASSERT(names.insert(p.name).second, "optimizer layout names {} twice", p.name);
    OASES_ASSERT(static_cast<int>(p.shape.size()) <= Shape::kMaxDims,
                 "parameter {} has {} dimensions; tensors have at most {}", p.name, p.shape.size(),
                 Shape::kMaxDims);
    for (const std::int64_t d : p.shape)
      OASES_ASSERT(d >= 0, "parameter {} has shape [{}]", p.name, fmt::join(p.shape, ", "));
    const std::vector<std::int64_t>& whole = p.whole_shape();
    const int dims = static_cast<int>(p.shape.size());
    OASES_ASSERT(whole.size() == p.shape.size(),
                 "parameter {} has shard shape [{}] but whole shape [{}]", p.name,
                 fmt::join(p.shape, ", "), fmt::join(whole, ", "));
    OASES_ASSERT(p.split_dim == -1 || (dims > 0 && (p.split_dim == 0 || p.split_dim == dims - 1)),
                 "parameter {} is split along dimension {}; valid: -1, 0 or {}", p.name,
                 p.split_dim, dims - 1);
    for (int d = 0; d < dims; ++d) {
      const auto u = static_cast<std::size_t>(d);
      OASES_ASSERT(d == p.split_dim || d == 0 || whole[u] == p.shape[u],
                   "parameter {}: shard shape [{}] and whole shape [{}] differ in dimension {}, "
                   "which is not split",
                   p.name, fmt::join(p.shape, ", "), fmt::join(whole, ", "), d);
    }
    const std::int64_t entry = dims == 0 || p.shape[0] == 0 ? 1 : p.numel() / p.shape[0];
    OASES_ASSERT(p.padding >= 0 && p.padding <= p.numel() && p.padding % entry == 0,
                 "parameter {}: padding of {} elements is not a whole number of dim-0 entries "
                 "of its shard [{}]",
                 p.name, p.padding, fmt::join(p.shape, ", "));
    OASES_ASSERT(p.offset >= previous_end,
                 "parameter {} at offset {} overlaps or precedes {} (which ends at {})", p.name,
                 p.offset, previous, previous_end);
    OASES_ASSERT(p.end() <= layout.total_numel,
                 "parameter {} ends at element {}, past the flat array's {} elements", p.name,
                 p.end(), layout.total_numel);
    previous_end = p.end();
    previous = p.name;
  }
}

}  // namespace oases::optim
