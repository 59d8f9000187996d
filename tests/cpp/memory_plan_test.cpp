#include <gtest/gtest.h>

#include <random>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

bool overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) { return a < b + bn && b < a + an; }

TEST(MemoryPlan, TensorsAliveTogetherNeverShareBytes) {
  std::random_device device;
  unsigned seed = device();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<ArenaRequest> requests(1 + rng() % 40);
    for (auto& r : requests) {
      r.nbytes = 1 + rng() % 100000;
      r.first_op = static_cast<int>(rng() % 30);
      r.last_op = r.first_op + static_cast<int>(rng() % 10);
    }
    ArenaPlan plan = plan_arena(requests);
    uint64_t total = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(plan.offsets[i] % kArenaAlignment, 0u);
      EXPECT_LE(plan.offsets[i] + requests[i].nbytes, plan.arena_bytes);
      total += requests[i].nbytes;
      for (size_t j = 0; j < i; ++j) {
        bool alive_together = requests[i].first_op <= requests[j].last_op && requests[j].first_op <= requests[i].last_op;
        if (alive_together)
          EXPECT_FALSE(overlaps(plan.offsets[i], requests[i].nbytes, plan.offsets[j], requests[j].nbytes))
              << "requests " << i << " and " << j;
      }
    }
    EXPECT_LE(plan.arena_bytes, total + requests.size() * kArenaAlignment);
  }
}

TEST(MemoryPlan, DisjointLifetimesReuseMemory) {
  // A chain a -> b -> c -> d: each tensor dies when the next is written.
  std::vector<ArenaRequest> chain = {{4096, 0, 1}, {4096, 1, 2}, {4096, 2, 3}, {4096, 3, 4}};
  ArenaPlan plan = plan_arena(chain);
  EXPECT_EQ(plan.arena_bytes, 2u * 4096u);
}

TEST(MemoryPlan, NegativeLifetimeIsRejected) {
  EXPECT_THROW(plan_arena({{16, 3, 2}}), CompileError);
}

}  // namespace
}  // namespace kiln::passes
