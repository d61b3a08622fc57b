// The single-process Mesh and launcher detection, in a plain process that never starts MPI.
#include "comm/mesh.h"
#include "comm/mpi_runtime.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace oases::comm {
namespace {

TEST(Mesh, SingleProcessHasGroupsOfOne) {
  Mesh mesh = Mesh::single_process();
  EXPECT_EQ(mesh.world_size(), 1);
  EXPECT_EQ(mesh.world_rank(), 0);
  EXPECT_EQ(mesh.tp_rank(), 0);
  EXPECT_EQ(mesh.dp_rank(), 0);
  EXPECT_EQ(mesh.pp_rank(), 0);
  for (Communicator* group :
       {&mesh.world(), &mesh.tp_group(), &mesh.dp_group(), &mesh.pp_group()}) {
    EXPECT_EQ(group->size(), 1);
    EXPECT_EQ(group->rank(), 0);
    std::vector<float> input{1, 2, 3}, output(3);
    group->all_reduce(Tensor::of(input.data(), {3}));
    group->all_gather(Tensor::of(input.data(), {3}), Tensor::of(output.data(), {3}));
    EXPECT_EQ(output, input);
  }
  EXPECT_EQ(mesh.tp_group().name(), "tp");
  EXPECT_EQ(mesh.dp_group().name(), "dp");
  EXPECT_EQ(mesh.pp_group().name(), "pp");
  EXPECT_EQ(mesh.world().name(), "world");

  Mesh moved = std::move(mesh);
  EXPECT_EQ(moved.tp_group().name(), "tp");
}

TEST(Mesh, SingleProcessAskedForMoreRanksSaysHowToLaunch) {
  try {
    Mesh::single_process(4, 1, 1);
    FAIL() << "no throw";
  } catch (const UserError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("parallel.tp * parallel.dp * parallel.pp = 4 * 1 * 1 = 4 must equal the "
                        "number of processes, 1; launch 4 processes (mpirun -np 4)"),
              std::string::npos)
        << text;
  }
}

// Sets or clears an environment variable for the life of the object, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(MpiRuntime, LaunchedByMpiReadsTheLaunchersEnvironment) {
  const char* launcher_variables[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK",
                                      "MV2_COMM_WORLD_SIZE"};
  std::vector<std::unique_ptr<ScopedEnv>> cleared;
  for (const char* name : launcher_variables)
    cleared.push_back(std::make_unique<ScopedEnv>(name, nullptr));
  ScopedEnv slurm("SLURM_PROCID", "0");  // a batch script: not a launcher
  EXPECT_FALSE(launched_by_mpi());
  for (const char* name : launcher_variables) {
    ScopedEnv set(name, "2");
    EXPECT_TRUE(launched_by_mpi()) << name;
  }
}

TEST(MpiRuntime, StartupLineListsEachHostWithItsRanks) {
  EXPECT_EQ(describe_rank_hosts({"a", "a", "b", "b"}),
            "4 ranks on 2 hosts: a (ranks 0, 1), b (ranks 2, 3)");
  // mpirun --map-by node deals ranks out in turn.
  EXPECT_EQ(describe_rank_hosts({"a", "b", "a", "b"}),
            "4 ranks on 2 hosts: a (ranks 0, 2), b (ranks 1, 3)");
  EXPECT_EQ(describe_rank_hosts({"node7", "node7", "node7", "node2"}),
            "4 ranks on 2 hosts: node7 (ranks 0-2), node2 (rank 3)");
  EXPECT_EQ(describe_rank_hosts({"solo"}), "1 rank on 1 host: solo (rank 0)");
}

}  // namespace
}  // namespace oases::comm
