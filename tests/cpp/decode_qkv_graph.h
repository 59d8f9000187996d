// A decode layer's tail after its q|k|v projection, as torch.export writes it
// (heads split by view + permute, HF's rotate_half rotary on q and k, k and v
// written into their caches at the position), and the reference its steps
// must match. Shared by the launch-group test (the three steps as one launch)
// and the GEMV loop-epilogue test (the projection running them itself).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "compiler_test_util.h"
#include "host_kernel.h"

namespace kiln::testing {

// Heads [start, start + n) of a [1, 1, width] projection as [1, n, 1, hd].
inline int decode_heads_of(ir::Graph& g, int qkv, int64_t start, int64_t n, int64_t hd) {
  using Shape = std::vector<int64_t>;
  const engine::DType dt = g.value(qkv).dtype;
  const int s = slice_last(g, qkv, start * hd, (start + n) * hd);
  const int v = out0(g, g.add_node("aten.view_copy.default", "view", {s}, {{"size", Shape{1, 1, n, hd}}},
                                   {{dt, {1, 1, n, hd}}}));
  return out0(g, g.add_node("aten.permute_copy.default", "perm", {v}, {{"dims", Shape{0, 2, 1, 3}}},
                            {{dt, {1, n, 1, hd}}}));
}

// HF's rotate_half rotary as torch.export writes it.
inline int hf_rope(ir::Graph& g, int x, int cos, int sin) {
  const std::vector<int64_t> xs = g.value(x).shape;
  const engine::DType dt = g.value(x).dtype;
  const int64_t d = xs.back();
  const int x2 = slice_last(g, x, d / 2, d), x1 = slice_last(g, x, 0, d / 2);
  const int neg = out0(g, g.add_node("aten.neg.default", "neg", {x2}, {}, {{dt, g.value(x2).shape}}));
  const int cat = out0(g, g.add_node("aten.cat.default", "cat", {neg, x1}, {{"dim", int64_t{-1}}}, {{dt, xs}}));
  const int m1 = out0(g, g.add_node("aten.mul.Tensor", "mul_cos", {x, cos}, {}, {{dt, xs}}));
  const int m2 = out0(g, g.add_node("aten.mul.Tensor", "mul_sin", {sin, cat}, {}, {{dt, xs}}));
  return out0(g, g.add_node("aten.add.Tensor", "add", {m2, m1}, {}, {{dt, xs}}));
}

// cache[:, :, pos] = values (an in-place update of state `cache`); its result.
inline int cache_write(ir::Graph& g, int cache, int pos, int values) {
  const int node = g.add_node("aten.index_put.default", "update", {cache, pos, values},
                              {{"indices_count", int64_t{1}}, {"indices_positions", std::vector<int64_t>{2}},
                               {"accumulate", false}},
                              {{g.value(cache).dtype, g.value(cache).shape}});
  g.set_state_update(cache, out0(g, node));
  return out0(g, node);
}

// The tail's values: q's rotary (the graph's output) and both caches' updates.
struct DecodeQkv {
  int64_t q_heads = 0, kv_heads = 0, hd = 0, slots = 0;
  int pos = -1, cos = -1, sin = -1, q = -1, k_out = -1, v_out = -1;
};

// Adds the tail reading `qkv` ([1, 1, (q_heads + 2 kv_heads) * hd]): the
// caches ([1, kv_heads, slots, hd] states), pos, cos and sin inputs.
inline DecodeQkv add_decode_qkv(ir::Graph& g, int qkv, int64_t q_heads, int64_t kv_heads, int64_t hd,
                                int64_t slots) {
  const engine::DType dt = g.value(qkv).dtype;
  DecodeQkv d{q_heads, kv_heads, hd, slots};
  const int kc = g.add_state("k_cache", dt, {1, kv_heads, slots, hd}, "kiln/test/state/k_cache");
  const int vc = g.add_state("v_cache", dt, {1, kv_heads, slots, hd}, "kiln/test/state/v_cache");
  d.pos = g.add_input("pos", engine::DType::kInt64, {1});
  d.cos = g.add_input("cos", dt, {1, 1, 1, hd});
  d.sin = g.add_input("sin", dt, {1, 1, 1, hd});
  d.q = hf_rope(g, decode_heads_of(g, qkv, 0, q_heads, hd), d.cos, d.sin);
  d.k_out = cache_write(g, kc, d.pos, hf_rope(g, decode_heads_of(g, qkv, q_heads, kv_heads, hd), d.cos, d.sin));
  d.v_out = cache_write(g, vc, d.pos, decode_heads_of(g, qkv, q_heads + kv_heads, kv_heads, hd));
  g.set_outputs({d.q});
  return d;
}

// The kernel arguments of `kernel` (graph value ids, TestLowerContext) as
// pointers into `buffer`, and the argument array a launch takes (pointing at
// `pointers`); a value without a buffer fails the test.
inline void kernel_args(const ir::Graph& g, const engine::KernelStep& kernel, const std::map<uint32_t, void*>& buffer,
                        std::vector<void*>& pointers, std::vector<void*>& args) {
  pointers.clear();
  for (const engine::KernelArg& a : kernel.args) {
    ASSERT_EQ(a.kind, engine::KernelArgKind::kTensor);
    auto it = buffer.find(a.tensor);
    ASSERT_NE(it, buffer.end()) << "argument names value " << g.value(static_cast<int>(a.tensor)).name;
    pointers.push_back(it->second);
  }
  args.clear();
  for (void*& p : pointers) args.push_back(&p);
}

// Buffers for the tail: random cos, sin and caches (kept as they were before
// the step), q's output and the position, a random slot.
struct DecodeQkvBuffers {
  std::vector<uint8_t> cos, sin, k_cache, v_cache, k_before, v_before, q;
  std::vector<int64_t> pos;
};

inline DecodeQkvBuffers decode_qkv_buffers(const DecodeQkv& d, engine::DType dt, std::mt19937& rng) {
  auto random = [&](int64_t n) { return random_elems(dt, n, rng, -2.0f, 2.0f); };
  DecodeQkvBuffers b;
  b.cos = random(d.hd);
  b.sin = random(d.hd);
  b.k_cache = random(d.kv_heads * d.slots * d.hd);
  b.v_cache = random(d.kv_heads * d.slots * d.hd);
  b.k_before = b.k_cache;
  b.v_before = b.v_cache;
  b.q.assign(static_cast<size_t>(d.q_heads * d.hd) * engine::dtype_size(dt), 0);
  b.pos = {std::uniform_int_distribution<int64_t>(0, d.slots - 1)(rng)};
  return b;
}

// `buffer` (value id -> pointer, as TestLowerContext names arguments) with
// the tail's values: pos, cos, sin, q's output and the caches (the updates'
// results are the caches' storage).
inline void add_decode_qkv_buffers(std::map<uint32_t, void*>& buffer, const DecodeQkv& d, DecodeQkvBuffers& b) {
  buffer[static_cast<uint32_t>(d.pos)] = b.pos.data();
  buffer[static_cast<uint32_t>(d.cos)] = b.cos.data();
  buffer[static_cast<uint32_t>(d.sin)] = b.sin.data();
  buffer[static_cast<uint32_t>(d.q)] = b.q.data();
  buffer[static_cast<uint32_t>(d.k_out)] = b.k_cache.data();
  buffer[static_cast<uint32_t>(d.v_out)] = b.v_cache.data();
}

// q, the k cache and the v cache after the step against the reference from
// `qkv` (the projection's values, in the dtype): q's and k's rotary within a
// rounding, v's row bit for bit, every other cache row untouched.
inline void check_decode_qkv(const DecodeQkv& d, engine::DType dt, const std::vector<uint8_t>& qkv,
                             const DecodeQkvBuffers& b) {
  const double tol = dt == engine::DType::kFloat32 ? 1e-5 : dt == engine::DType::kFloat16 ? 2e-3 : 1.6e-2;
  const int64_t hd = d.hd, slot = b.pos[0];
  auto x = [&](int64_t head, int64_t j) { return read_elem(dt, qkv, static_cast<size_t>(head * hd + j)); };
  auto rotary = [&](int64_t head, int64_t j) {
    const int64_t h = hd / 2;
    const double r = j < h ? -x(head, j + h) : x(head, j - h);
    return round_to(dt, x(head, j) * read_elem(dt, b.cos, static_cast<size_t>(j)) +
                            r * read_elem(dt, b.sin, static_cast<size_t>(j)));
  };
  for (int64_t head = 0; head < d.q_heads; ++head)
    for (int64_t j = 0; j < hd; ++j) {
      const double want = rotary(head, j);
      ASSERT_NEAR(read_elem(dt, b.q, static_cast<size_t>(head * hd + j)), want, tol * (1.0 + std::fabs(want)))
          << "q head " << head << " element " << j;
    }
  for (int64_t head = 0; head < d.kv_heads; ++head)
    for (int64_t s = 0; s < d.slots; ++s)
      for (int64_t j = 0; j < hd; ++j) {
        const size_t at = static_cast<size_t>((head * d.slots + s) * hd + j);
        const double k_want = s == slot ? rotary(d.q_heads + head, j) : read_elem(dt, b.k_before, at);
        const double v_want = s == slot ? x(d.q_heads + d.kv_heads + head, j) : read_elem(dt, b.v_before, at);
        ASSERT_NEAR(read_elem(dt, b.k_cache, at), k_want, tol * (1.0 + std::fabs(k_want)))
            << "k cache head " << head << " slot " << s << " element " << j;
        ASSERT_EQ(read_elem(dt, b.v_cache, at), v_want) << "v cache head " << head << " slot " << s << " element " << j;
      }
}

}  // namespace kiln::testing
