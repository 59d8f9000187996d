// ops::view_factored: a view of a permuted tensor described by strided
// factors, checked element by element against the offsets a brute-force
// walk computes, on random shapes, permutations and regroupings.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "ops/view_ops.h"

namespace kiln::ops {
namespace {

using Shape = std::vector<int64_t>;

// Storage offset of each element of `dims` in row-major order.
std::vector<int64_t> offsets_of(const FactoredDims& dims) {
  std::vector<StrideFactor> flat;
  for (const auto& d : dims) flat.insert(flat.end(), d.begin(), d.end());
  int64_t n = 1;
  for (const auto& f : flat) n *= f.size;
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i, off = 0;
    for (size_t j = flat.size(); j-- > 0;) {
      off += (rest % flat[j].size) * flat[j].stride;
      rest /= flat[j].size;
    }
    out[static_cast<size_t>(i)] = off;
  }
  return out;
}

TEST(ViewFactored, MultiheadAttentionHeadSplitAtBatchAbove1) {
  // [S, B, 3E] projection -> [S, B, 3, E] -> select q -> [S, B*H, D]:
  // the merged B*H has two strides; splitting it to [B, H] recovers them.
  const int64_t S = 17, B = 4, H = 4, D = 16, E = H * D;
  FactoredDims dims = factored_dims({S, B, 3 * E}, {B * 3 * E, 3 * E, 1});
  auto v = view_factored(dims, {S, B, 3, E});
  ASSERT_TRUE(v);
  v->erase(v->begin() + 2);  // select(2, 0): offset 0
  auto merged = view_factored(*v, {S, B * H, D});
  ASSERT_TRUE(merged);
  EXPECT_FALSE(plain_strides(*merged));  // no single stride for B*H
  FactoredDims perm = {(*merged)[1], (*merged)[0], (*merged)[2]};
  auto split = view_factored(perm, {B, H, S, D});
  ASSERT_TRUE(split);
  auto st = plain_strides(*split);
  ASSERT_TRUE(st);
  EXPECT_EQ(*st, (Shape{3 * E, D, B * 3 * E, 1}));
}

TEST(ViewFactored, RefusesAnUnevenCut) {
  FactoredDims dims = factored_dims({6, 4}, {1, 6});  // a transpose of [4, 6]
  EXPECT_FALSE(view_factored(dims, {4, 6}));           // would cut the 6 into 4s
  EXPECT_TRUE(view_factored(dims, {3, 2, 2, 2}));
}

TEST(ViewFactored, MatchesBruteForceOnRandomPermutedViews) {
  std::mt19937 rng(1234);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t rank = 2 + rng() % 3;
    Shape shape(rank);
    for (auto& s : shape) s = 1 + static_cast<int64_t>(rng() % 4) * (rng() % 2 ? 2 : 1);
    std::vector<int64_t> perm(rank);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const Shape strides = ir::contiguous_strides(shape);
    FactoredDims dims = factored_dims(shape, strides);
    FactoredDims permuted(rank);
    Shape pshape(rank);
    for (size_t j = 0; j < rank; ++j) {
      permuted[j] = dims[static_cast<size_t>(perm[j])];
      pshape[j] = shape[static_cast<size_t>(perm[j])];
    }
    // A random regrouping of the permuted elements: split each dim into
    // its prime factors, then merge random neighbours.
    Shape primes;
    for (int64_t s : pshape)
      for (int64_t p = 2, x = s; x > 1;)
        if (x % p == 0) { primes.push_back(p); x /= p; } else { ++p; }
    Shape target;
    for (int64_t p : primes) {
      if (!target.empty() && rng() % 2) target.back() *= p; else target.push_back(p);
    }
    if (target.empty()) target.push_back(1);
    const std::vector<int64_t> expected = offsets_of(permuted);
    auto v = view_factored(permuted, target);
    if (!v) continue;
    EXPECT_EQ(factored_shape(*v), target);
    EXPECT_EQ(offsets_of(*v), expected) << "trial " << trial;
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace kiln::ops
