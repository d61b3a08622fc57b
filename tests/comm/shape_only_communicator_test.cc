// A group known by its shape alone (comm::ShapeOnlyCommunicator): it reports its rank and size,
// and anything that would move data over it is an internal error naming it.
#include "comm/communicator.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace oases::comm {
namespace {

TEST(ShapeOnlyCommunicator, ReportsItsShapeAndRefusesToMoveData) {
  ShapeOnlyCommunicator group(3, 8, "tp");
  EXPECT_EQ(group.rank(), 3);
  EXPECT_EQ(group.size(), 8);
  EXPECT_EQ(group.name(), "tp");
  std::vector<float> values(4, 1.0f);
  const Tensor t = Tensor::of(values.data(), {4});
  try {
    group.all_reduce(t);
    ADD_FAILURE() << "an all-reduce over a shape-only group returned";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("group tp describes a shape only (rank 3 of 8)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(group.all_to_all(t, t), InternalError);
  EXPECT_THROW(ShapeOnlyCommunicator(2, 2), InternalError);
}

}  // namespace
}  // namespace oases::comm
