// Mesh and MpiRuntime under mpirun: coordinates and group memberships for every layout of
// the world, the error for a layout of the wrong size, and the settings the runtime makes.
#include "comm/mesh.h"
#include "comm/mpi_runtime.h"
#include "mpi_test_support.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace oases::comm {
namespace {

using mpitest::runtime;
using mpitest::test_options;

// World ranks of a group's members, in group rank order, learnt through the group itself.
std::vector<std::int64_t> members(Communicator& group) {
  std::vector<std::int64_t> mine{runtime().world_rank()};
  std::vector<std::int64_t> all(static_cast<std::size_t>(group.size()), -1);
  group.all_gather(Tensor::of(mine.data(), {1}), Tensor::of(all.data(), {group.size()}));
  return all;
}

TEST(Mesh, CoordinatesAndGroupsOfEveryLayout) {
  const int world_rank = runtime().world_rank();
  for (const auto& [tp, dp, pp] : mpitest::layouts(runtime().world_size())) {
    SCOPED_TRACE(::testing::Message() << "tp=" << tp << " dp=" << dp << " pp=" << pp);
    Mesh mesh = Mesh::create(runtime(), tp, dp, pp, test_options());
    EXPECT_EQ(mesh.tp_size(), tp);
    EXPECT_EQ(mesh.dp_size(), dp);
    EXPECT_EQ(mesh.pp_size(), pp);
    EXPECT_EQ(mesh.world_size(), runtime().world_size());
    // TP fastest, then DP, then PP.
    EXPECT_EQ(mesh.tp_rank(), world_rank % tp);
    EXPECT_EQ(mesh.dp_rank(), world_rank / tp % dp);
    EXPECT_EQ(mesh.pp_rank(), world_rank / (tp * dp));
    EXPECT_EQ(mesh.world_rank(), world_rank);
    EXPECT_EQ(mesh.tp_rank() + tp * (mesh.dp_rank() + dp * mesh.pp_rank()), world_rank);

    EXPECT_EQ(mesh.world().name(), "world");
    EXPECT_EQ(mesh.tp_group().name(), "tp");
    EXPECT_EQ(mesh.dp_group().name(), "dp");
    EXPECT_EQ(mesh.pp_group().name(), "pp");
    EXPECT_EQ(mesh.world().size(), runtime().world_size());
    EXPECT_EQ(mesh.world().rank(), world_rank);
    EXPECT_EQ(mesh.tp_group().size(), tp);
    EXPECT_EQ(mesh.dp_group().size(), dp);
    EXPECT_EQ(mesh.pp_group().size(), pp);
    EXPECT_EQ(mesh.tp_group().rank(), mesh.tp_rank());
    EXPECT_EQ(mesh.dp_group().rank(), mesh.dp_rank());
    EXPECT_EQ(mesh.pp_group().rank(), mesh.pp_rank());

    std::vector<std::int64_t> expected_tp, expected_dp, expected_pp, expected_world;
    for (int t = 0; t < tp; ++t)
      expected_tp.push_back(mesh.world_rank_of(t, 0, mesh.dp_rank(), mesh.pp_rank()));
    for (int d = 0; d < dp; ++d)
      expected_dp.push_back(mesh.world_rank_of(mesh.tp_rank(), 0, d, mesh.pp_rank()));
    for (int p = 0; p < pp; ++p)
      expected_pp.push_back(mesh.world_rank_of(mesh.tp_rank(), 0, mesh.dp_rank(), p));
    for (int w = 0; w < runtime().world_size(); ++w) expected_world.push_back(w);
    EXPECT_EQ(members(mesh.tp_group()), expected_tp);
    EXPECT_EQ(members(mesh.dp_group()), expected_dp);
    EXPECT_EQ(members(mesh.pp_group()), expected_pp);
    EXPECT_EQ(members(mesh.world()), expected_world);
  }
}

TEST(Mesh, FourRankLayoutsFromTheDesign) {
  if (runtime().world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int r = runtime().world_rank();
  {
    Mesh mesh = Mesh::create(runtime(), 2, 2, 1, test_options());  // TP pairs {0,1}, {2,3}
    EXPECT_EQ(members(mesh.tp_group()), (std::vector<std::int64_t>{r / 2 * 2, r / 2 * 2 + 1}));
    EXPECT_EQ(members(mesh.dp_group()), (std::vector<std::int64_t>{r % 2, r % 2 + 2}));
  }
  {
    Mesh mesh = Mesh::create(runtime(), 1, 2, 2, test_options());  // DP pairs {0,1}, {2,3}
    EXPECT_EQ(members(mesh.dp_group()), (std::vector<std::int64_t>{r / 2 * 2, r / 2 * 2 + 1}));
    EXPECT_EQ(members(mesh.pp_group()), (std::vector<std::int64_t>{r % 2, r % 2 + 2}));
    EXPECT_EQ(mesh.pp_rank(), r / 2);
  }
}

// Context parallelism between tp and dp: at tp 1 x cp 2 x dp 2 the cp pairs are {0,1} and
// {2,3}; the replicas that sum gradients (dp_group) are all four, ordered by cp_rank + 2 dp_rank;
// at tp 2 x cp 2 the cp pairs are {0,2} and {1,3}.
TEST(Mesh, ContextParallelGroupsSitBetweenTensorAndDataParallel) {
  if (runtime().world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int r = runtime().world_rank();
  {
    Mesh mesh = Mesh::create(runtime(), MeshDegrees{1, 2, 2, 1}, test_options());
    EXPECT_EQ(mesh.cp_size(), 2);
    EXPECT_EQ(mesh.dp_size(), 2);
    EXPECT_EQ(mesh.cp_rank(), r % 2);
    EXPECT_EQ(mesh.dp_rank(), r / 2);
    EXPECT_EQ(mesh.world_rank_of(0, r % 2, r / 2, 0), r);
    EXPECT_EQ(mesh.cp_group().name(), "cp");
    EXPECT_EQ(members(mesh.cp_group()), (std::vector<std::int64_t>{r / 2 * 2, r / 2 * 2 + 1}));
    EXPECT_EQ(members(mesh.dp_group()), (std::vector<std::int64_t>{0, 1, 2, 3}));
    EXPECT_EQ(mesh.dp_group().rank(), mesh.replica_rank());
    EXPECT_EQ(mesh.tp_group().size(), 1);
    EXPECT_EQ(mesh.pp_group().size(), 1);
  }
  {
    Mesh mesh = Mesh::create(runtime(), MeshDegrees{2, 2, 1, 1}, test_options());
    EXPECT_EQ(members(mesh.tp_group()), (std::vector<std::int64_t>{r / 2 * 2, r / 2 * 2 + 1}));
    EXPECT_EQ(members(mesh.cp_group()), (std::vector<std::int64_t>{r % 2, r % 2 + 2}));
    EXPECT_EQ(members(mesh.dp_group()), (std::vector<std::int64_t>{r % 2, r % 2 + 2}));
    EXPECT_EQ(members(mesh.tp_replica_group(1)), (std::vector<std::int64_t>{0, 1, 2, 3}));
  }
}

// Per-layer degrees at tp = 4: groups of degree 2 are {0,1} and {2,3}; the replicas of a
// degree-2 shard are {0,2} and {1,3}, which is also how rows of degree-2 layers are gathered
// into a degree-4 layer; the replicas of a degree-1 layer are the whole group.
TEST(Mesh, TensorParallelSubgroupsAtTp4) {
  if (runtime().world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int r = runtime().world_rank();
  Mesh mesh = Mesh::create(runtime(), 4, 1, 1, test_options());
  EXPECT_EQ(members(mesh.tp_subgroup(2, 1)), (std::vector<std::int64_t>{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(members(mesh.tp_subgroup(4, 2)), (std::vector<std::int64_t>{r % 2, r % 2 + 2}));
  EXPECT_EQ(&mesh.tp_subgroup(4, 1), &mesh.tp_group());
  EXPECT_EQ(mesh.tp_subgroup(2, 2).size(), 1);
  EXPECT_EQ(mesh.tp_subgroup(1, 1).size(), 1);
  // Gradient reductions of replicated layers: the same members, a communicator of their own.
  EXPECT_EQ(members(mesh.tp_replica_group(2)), (std::vector<std::int64_t>{r % 2, r % 2 + 2}));
  EXPECT_EQ(members(mesh.tp_replica_group(1)), (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_NE(&mesh.tp_replica_group(1), &mesh.tp_group());
  EXPECT_EQ(&mesh.tp_replica_group(4), &mesh.dp_group());
  // With dp = 2 the sub-groups stay inside each tensor-parallel group, while the replicas of a
  // degree-1 layer are in both (and those of a degree-2 layer are the dp group).
  Mesh pairs = Mesh::create(runtime(), 2, 2, 1, test_options());
  EXPECT_EQ(&pairs.tp_subgroup(2, 1), &pairs.tp_group());
  EXPECT_EQ(pairs.tp_subgroup(2, 2).size(), 1);
  EXPECT_EQ(members(pairs.tp_replica_group(1)), (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(&pairs.tp_replica_group(2), &pairs.dp_group());
}

TEST(Mesh, WrongWorldSizeIsAUserError) {
  const int world = runtime().world_size();
  try {
    Mesh::create(runtime(), 2, 2, world, test_options());
    ADD_FAILURE() << "no throw";
  } catch (const UserError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find(fmt::format("parallel.tp * parallel.dp * parallel.pp = 2 * 2 * {} = {} "
                                    "must equal the number of processes, {}",
                                    world, 4 * world, world)),
              std::string::npos)
        << text;
    EXPECT_NE(text.find(fmt::format("mpirun -np {}", 4 * world)), std::string::npos) << text;
    EXPECT_NE(text.find(fmt::format("tp={} dp=1 pp=1", world)), std::string::npos) << text;
  }
  EXPECT_THROW(Mesh::create(runtime(), 0, world, 1, test_options()), UserError);
}

TEST(MpiRuntime, DetectsTheLauncherAndMakesOpenMpiYield) {
  EXPECT_TRUE(launched_by_mpi());
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(runtime().world_rank(), rank);
  EXPECT_EQ(runtime().world_size(), size);
  int level = 0;
  MPI_Query_thread(&level);
  EXPECT_EQ(level, MPI_THREAD_MULTIPLE);

  // The value OpenMPI actually uses, read back through the MPI tool interface.
  int provided = 0;
  ASSERT_EQ(MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided), MPI_SUCCESS);
  int index = -1;
  ASSERT_EQ(MPI_T_cvar_get_index("mpi_yield_when_idle", &index), MPI_SUCCESS);
  MPI_T_cvar_handle handle;
  int count = 0;
  ASSERT_EQ(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count), MPI_SUCCESS);
  ASSERT_EQ(count, 1);
  // A bool parameter: OpenMPI writes one byte, so read into zeroed storage.
  std::int64_t value = 0;
  ASSERT_EQ(MPI_T_cvar_read(handle, &value), MPI_SUCCESS);
  MPI_T_cvar_handle_free(&handle);
  MPI_T_finalize();
  EXPECT_NE(value, 0) << "mpi_yield_when_idle is off";
}

}  // namespace
}  // namespace oases::comm
