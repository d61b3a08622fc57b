#include "comm/mesh.h"

#include "comm/mpi_communicator.h"
#include "core/error.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

namespace oases::comm {
namespace {

// A few layouts with `world_size` ranks, closest to the requested one first.
std::string valid_layouts(int world_size, int tp, int pp) {
  std::vector<std::array<int, 3>> layouts;
  auto add = [&](int t, int d, int p) {
    const std::array<int, 3> layout{t, d, p};
    if (std::find(layouts.begin(), layouts.end(), layout) == layouts.end())
      layouts.push_back(layout);
  };
  if (world_size % (tp * pp) == 0) add(tp, world_size / (tp * pp), pp);
  if (world_size % tp == 0) add(tp, world_size / tp, 1);
  add(world_size, 1, 1);
  add(1, world_size, 1);
  std::string text;
  for (const auto& [t, d, p] : layouts) {
    if (!text.empty()) text += "; ";
    text += fmt::format("tp={} dp={} pp={}", t, d, p);
  }
  return text;
}

void check_layout(int world_size, MeshDegrees d) {
  const auto [tp, cp, dp, pp] = d;
  OASES_CHECK(tp >= 1 && cp >= 1 && dp >= 1 && pp >= 1,
              "parallel.tp = {}, parallel.cp = {}, parallel.dp = {}, parallel.pp = {}: each "
              "degree must be >= 1",
              tp, cp, dp, pp);
  const long long product = static_cast<long long>(tp) * cp * dp * pp;
  if (cp == 1)
    OASES_CHECK(product == world_size,
                "parallel.tp * parallel.dp * parallel.pp = {} * {} * {} = {} must equal the "
                "number of processes, {}; launch {} processes (mpirun -np {}) or choose degrees "
                "whose product is {}, e.g. {}",
                tp, dp, pp, product, world_size, product, product, world_size,
                valid_layouts(world_size, tp, pp));
  OASES_CHECK(product == world_size,
              "parallel.tp * parallel.cp * parallel.dp * parallel.pp = {} * {} * {} * {} = {} "
              "must equal the number of processes, {}; launch {} processes (mpirun -np {}) or "
              "choose degrees whose product is {}{}",
              tp, cp, dp, pp, product, world_size, product, product, world_size,
              world_size % (tp * cp * pp) == 0
                  ? fmt::format(", e.g. parallel.dp = {}", world_size / (tp * cp * pp))
                  : std::string());
}

// The group of `world`'s ranks that share `color`, ordered by `key`, as an MpiCommunicator.
std::unique_ptr<Communicator> split(int color, int key, const char* name,
                                    const MpiCommunicatorOptions& options) {
  MPI_Comm part = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, key, &part);
  auto group = std::make_unique<MpiCommunicator>(part, name, options);  // duplicates `part`
  MPI_Comm_free(&part);
  return group;
}

}  // namespace

Mesh::Mesh(MeshDegrees d, int world_rank)
    : tp_(d.tp),
      cp_(d.cp),
      dp_(d.dp),
      pp_(d.pp),
      tp_rank_(world_rank % d.tp),
      cp_rank_(world_rank / d.tp % d.cp),
      dp_rank_(world_rank / (d.tp * d.cp) % d.dp),
      pp_rank_(world_rank / (d.tp * d.cp * d.dp)) {}

Mesh::Mesh(Mesh&&) noexcept = default;
Mesh& Mesh::operator=(Mesh&&) noexcept = default;
Mesh::~Mesh() = default;

Mesh Mesh::create(const MpiRuntime& runtime, MeshDegrees degrees, MpiCommunicatorOptions options) {
  check_layout(runtime.world_size(), degrees);
  Mesh mesh(degrees, runtime.world_rank());
  OASES_ASSERT(mesh.world_rank() == runtime.world_rank(), "mesh coordinates of world rank {}",
               runtime.world_rank());
  const int tp = degrees.tp, cp = degrees.cp, replicas = degrees.cp * degrees.dp;
  const int replica = mesh.replica_rank();
  // Every rank makes the same calls in the same order: each constructor is collective.
  mesh.world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", options);
  mesh.tp_group_ = split(replica + replicas * mesh.pp_rank_, mesh.tp_rank_, "tp", options);
  mesh.dp_group_ = split(mesh.tp_rank_ + tp * mesh.pp_rank_, replica, "dp", options);
  mesh.pp_group_ = split(mesh.tp_rank_ + tp * replica, mesh.pp_rank_, "pp", options);
  if (cp > 1)
    mesh.cp_group_ = split(mesh.tp_rank_ + tp * (mesh.dp_rank_ + degrees.dp * mesh.pp_rank_),
                           mesh.cp_rank_, "cp", options);
  else
    mesh.cp_group_ = std::make_unique<SelfCommunicator>("cp");
  mesh.self_ = std::make_unique<SelfCommunicator>("tp-self");
  // Colours must be distinct across (replica, pp) and the sub-group within the TP group.
  const int outer = replica + replicas * mesh.pp_rank_;
  for (int span = 2; span <= tp; ++span) {
    if (tp % span != 0) continue;
    for (int stride = 1; stride < span; ++stride) {
      if (span % stride != 0 || (span == tp && stride == 1)) continue;
      const int within = mesh.tp_rank_ / span * stride + mesh.tp_rank_ % stride;
      mesh.tp_subgroups_[{span, stride}] =
          split(outer * tp + within, mesh.tp_rank_,
                fmt::format("tp[{}/{}]", span, stride).c_str(), options);
    }
  }
  for (int degree = 1; degree < tp; ++degree) {
    if (tp % degree != 0) continue;
    mesh.tp_replica_groups_[degree] =
        split(mesh.pp_rank_ * tp + mesh.tp_rank_ % degree, mesh.world_rank(),
              fmt::format("tp-replicas[{}]", degree).c_str(), options);
  }
  return mesh;
}

Mesh Mesh::single_process(int tp, int dp, int pp, int cp) {
  check_layout(1, MeshDegrees{tp, cp, dp, pp});
  Mesh mesh(MeshDegrees{}, 0);
  mesh.world_ = std::make_unique<SelfCommunicator>("world");
  mesh.tp_group_ = std::make_unique<SelfCommunicator>("tp");
  mesh.cp_group_ = std::make_unique<SelfCommunicator>("cp");
  mesh.dp_group_ = std::make_unique<SelfCommunicator>("dp");
  mesh.pp_group_ = std::make_unique<SelfCommunicator>("pp");
  mesh.self_ = std::make_unique<SelfCommunicator>("tp-self");
  return mesh;
}

void Mesh::add_expert_groups(int ep, MpiCommunicatorOptions options) {
  OASES_ASSERT(ep >= 1 && dp_ % ep == 0 && (ep == 1 || cp_ == 1),
               "expert parallelism over {} of {} data-parallel ranks (cp = {})", ep, dp_, cp_);
  ep_ = ep;
  if (ep == 1) return;
  ep_group_ = split(tp_rank_ + tp_ * (dp_rank_ / ep + dp_ / ep * pp_rank_), dp_rank_ % ep, "ep",
                    options);
  for (int degree = 1; degree <= tp_; ++degree) {
    if (tp_ % degree != 0) continue;
    expert_replica_groups_[degree] =
        split(dp_rank_ % ep + ep * (pp_rank_ * tp_ + tp_rank_ % degree), world_rank(),
              fmt::format("expert-replicas[{}]", degree).c_str(), options);
  }
}

Communicator& Mesh::expert_replica_group(int degree) {
  OASES_ASSERT(degree >= 1 && tp_ % degree == 0, "degree {} does not divide tp = {}", degree, tp_);
  if (ep_ == 1) return tp_replica_group(degree);
  return *expert_replica_groups_.at(degree);
}

Communicator& Mesh::tp_replica_group(int degree) {
  OASES_ASSERT(degree >= 1 && tp_ % degree == 0, "degree {} does not divide tp = {}", degree, tp_);
  if (degree == tp_) return *dp_group_;
  return *tp_replica_groups_.at(degree);
}

Communicator& Mesh::tp_subgroup(int span, int stride) {
  OASES_ASSERT(span >= 1 && stride >= 1 && tp_ % span == 0 && span % stride == 0,
               "no tensor-parallel sub-group of span {} and stride {} in a group of {}", span,
               stride, tp_);
  if (span == stride) return *self_;
  if (span == tp_ && stride == 1) return *tp_group_;
  return *tp_subgroups_.at({span, stride});
}

}  // namespace oases::comm
