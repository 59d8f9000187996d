#include "ops/attention_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "codegen/cuda_dtype.h"
#include "ops/attention_kernel_parts.h"

namespace kiln::ops {
using codegen::load_expr;
using codegen::storage_type;
using codegen::store_expr;
namespace attention_detail {

// Helpers shared by every attention kernel of a module, emitted once.
const char* const kHelpers = R"(
#ifndef KILN_ATTENTION_HELPERS
#define KILN_ATTENTION_HELPERS
#define KILN_NEG_INF __int_as_float(0xff800000u)
__device__ __forceinline__ unsigned kiln_pack_f16x2(float lo, float hi) {
  unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ unsigned kiln_pack_bf16x2(float lo, float hi) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
__device__ __forceinline__ void kiln_mma_f16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void kiln_mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two 8x8 b16 matrices (rows addressed by lanes 0-7 and 8-15), transposed.
__device__ __forceinline__ void kiln_ldsm_x2_trans(unsigned& r0, unsigned& r1, const void* p) {
  unsigned long long g; asm("cvta.to.shared.u64 %0, %1;" : "=l"(g) : "l"(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"((unsigned)g));
}
// 16 bytes global -> shared without a register round trip; zero-filled
// (nothing read) when !full.
__device__ __forceinline__ void kiln_cp_async16(void* dst, const void* src, bool full) {
  unsigned long long g; asm("cvta.to.shared.u64 %0, %1;" : "=l"(g) : "l"(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"((unsigned)g), "l"(src), "r"(full ? 16 : 0) : "memory");
}
__device__ __forceinline__ void kiln_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void kiln_cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
// The first key tile after t whose bit is set in vis (t = -1: from tile 0);
// tiles when none is.
__device__ __forceinline__ int kiln_next_tile(const unsigned* vis, int t, int tiles) {
  for (++t; t < tiles; ++t)
    if ((vis[t >> 5] >> (t & 31)) & 1u) return t;
  return tiles;
}
#endif
)";

// The mask's contribution to score (row, key), in base-2 units, as
// statements updating float `x` (both in range).
std::string mask_update(const AttentionPlan& p, const std::string& row, const std::string& key) {
  if (p.mask_kind == AttentionPlan::Mask::kNone) return "";
  std::ostringstream s;
  s << "mp[(long long)" << row << " * " << ll(p.mask_strides[2]) << " + (long long)" << key << " * "
    << ll(p.mask_strides[3]) << "]";
  if (p.mask_kind == AttentionPlan::Mask::kBool) return "if (!" + s.str() + ") x = KILN_NEG_INF;";
  return "x += " + load_expr(p.dtype_mask, s.str()) + " * " + codegen::float_literal(kLog2e) + ";";
}

// Shared prologue: block coordinates and the base pointers of this
// (batch, head).
void emit_bases(std::ostream& s, const AttentionPlan& p) {
  const int64_t group = p.heads / p.kv_heads;
  s << "  const long long b = blockIdx.z, h = blockIdx.y, hk = h / " << ll(group) << ";\n"
    << "  const T* qb = q + " << ll(p.offsets[0]) << " + b * " << ll(p.q_strides[0]) << " + h * " << ll(p.q_strides[1]) << ";\n"
    << "  const T* kb = k + " << ll(p.offsets[1]) << " + b * " << ll(p.k_strides[0]) << " + hk * " << ll(p.k_strides[1]) << ";\n"
    << "  const T* vb = v + " << ll(p.offsets[2]) << " + b * " << ll(p.v_strides[0]) << " + hk * " << ll(p.v_strides[1]) << ";\n"
    ;
  if (p.splits > 1)
    s << "  float* pb = partials + ((b * " << ll(p.heads) << " + h) * " << ll(p.splits) << " + blockIdx.x) * "
      << ll(p.rows * (p.value_dim + 2)) << ";\n";
  else
    s << "  T* ob = out + b * " << ll(p.out_strides[0]) << " + h * " << ll(p.out_strides[1]) << ";\n";
  if (p.mask_kind != AttentionPlan::Mask::kNone)
    s << "  const M* mp = mask + " << ll(p.offsets[3]) << " + b * " << ll(p.mask_strides[0]) << " + h * " << ll(p.mask_strides[1]) << ";\n";
}

// The element offset of output row `row` (an expression) from the head's base.
std::string out_row_offset(const AttentionPlan& p, const std::string& row) {
  if (p.out_row_block <= 0) return "(long long)(" + row + ") * " + ll(p.out_strides[2]);
  return "((long long)(" + row + ") / " + ll(p.out_row_block) + " * " + ll(p.out_row_block_stride) + " + (long long)(" +
         row + ") % " + ll(p.out_row_block) + " * " + ll(p.out_strides[2]) + ")";
}

std::string signature(const AttentionPlan& p, const std::string& name, int threads) {
  std::ostringstream s;
  s << "extern \"C\" __global__ void __launch_bounds__(" << threads << ") " << name << "(const T* __restrict__ q, "
    << "const T* __restrict__ k, const T* __restrict__ v, ";
  if (p.mask_kind != AttentionPlan::Mask::kNone) s << "const M* __restrict__ mask, ";
  if (p.splits > 1)
    s << "float* __restrict__ partials)";
  else
    s << "T* __restrict__ out)";
  return s.str();
}

}  // namespace attention_detail

namespace {

using namespace attention_detail;

constexpr int kMmaKeyTile = 64;    // keys a tensor-core block stages per iteration
constexpr int kSimtKeyTile = 32;   // keys a SIMT block stages (one a lane)
constexpr int kSimtRowsPerBlock = 8;

int mma_warps(const AttentionPlan& p) {
  // Each warp of a block owns 16 query rows, and a block's warps share every
  // key/value tile it loads, so bigger blocks cost less memory traffic: four
  // warps as long as that leaves a block for about three quarters of an
  // H100-class GPU's 132 SMs. (The 410M Llama's prefill, 8 kv heads x 1024
  // grouped rows, H100: 128 four-warp blocks 2.78 ms to first token, 256
  // two-warp blocks 2.86 ms, 512 one-warp blocks 3.03 ms.)
  const int64_t pairs = p.batch * p.heads;
  for (int warps : {4, 2})
    if (pairs * ((p.rows + 16 * warps - 1) / (16 * warps)) >= 100) return warps;
  return 1;
}

// Stages of the key/value pipeline: two when both fit the 48 KiB of static
// shared memory (the next tile loads while this one computes), else one.
int mma_stages(const AttentionPlan& p) {
  const int64_t tile_bytes = int64_t{kMmaKeyTile} * ((p.head_dim + 8) + (p.value_dim + 8)) * 2;
  return 2 * tile_bytes <= 48 * 1024 ? 2 : 1;
}

// Whether K and V tiles can be copied in 16-byte vectors (cp.async).
bool mma_vec16(const AttentionPlan& p) {
  return p.offsets[1] % 8 == 0 && p.offsets[2] % 8 == 0 && p.k_strides[0] % 8 == 0 && p.k_strides[1] % 8 == 0 &&
         p.k_strides[2] % 8 == 0 && p.v_strides[0] % 8 == 0 && p.v_strides[1] % 8 == 0 && p.v_strides[2] % 8 == 0 &&
         p.head_dim % 8 == 0 && p.value_dim % 8 == 0;
}

// Statements copying key rows [n0, n0 + kBN) of `src` (row stride `stride`,
// `dim` columns) into the padded shared tile `dst` (row pitch `pitch`).
// Asynchronous: cp.async of 16 bytes, zero-filled past the last key; the
// caller commits the group. Synchronous: 4-byte loads and stores.
void emit_tile_load(std::ostream& s, bool async, const std::string& dst,
                    const std::string& src, int64_t stride, int64_t dim, const std::string& pitch,
                    const std::string& n0, int threads) {
  const int vec = async ? 8 : 2;
  const int64_t per_row = dim / vec;
  s << "    #pragma unroll 4\n"
    << "    for (int c = threadIdx.x; c < kBN * " << per_row << "; c += " << threads << ") {\n"
    << "      const int r = c / " << per_row << ", col = (c % " << per_row << ") * " << vec << ";\n"
    << "      const long long key = " << n0 << " + r;\n";
  if (async)
    s << "      kiln_cp_async16(" << dst << " + r * " << pitch << " + col, " << src << " + (key < kKeys ? key : 0) * "
      << ll(stride) << " + col, key < kKeys);\n";
  else
    s << "      *(unsigned*)(" << dst << " + r * " << pitch << " + col) = key < kKeys ? *(const unsigned*)(" << src
      << " + key * " << ll(stride) << " + col) : 0u;\n";
  s << "    }\n";
}

// The mask's value `x` for element e of column group j of this lane's score
// fragment (rows row0 + g and + 8, keys key0 + j * 8 + t4 * 2 and + 1): 0 for
// a row or key out of range.
void emit_mask_element(std::ostream& s, const AttentionPlan& p, const std::string& in, const std::string& key0) {
  s << in << "const long long row = row0 + g + (e >> 1) * 8, key = " << key0 << " + j * 8 + t4 * 2 + (e & 1);\n"
    << in << "float x = 0.0f;\n"
    << in << "if (row < kRows && key < kKeys) { " << mask_update(p, "row", "key") << " }\n";
}

// With a mask tensor, which key tiles some row of the block can see, as bits
// in shared `vis`, and the first of them (`t_first`). The main loop then
// neither copies nor waits for a tile the mask hides from every row: a
// KV-cache prefill's causal mask over the whole cache hides most tiles of
// most blocks, and each hidden tile cost a copy, its wait and two barriers.
// Every mask load of the scan is independent, so they overlap. A row or key
// out of range counts as visible, as in the main loop.
void emit_visible_tiles(std::ostream& s, const AttentionPlan& p, int threads) {
  s << "  constexpr int kTileWords = (int)((kKeys + kBN - 1) / kBN + 31) / 32;\n"
    << "  __shared__ unsigned vis[kTileWords];\n"
    << "  for (int i = threadIdx.x; i < kTileWords; i += " << threads << ") vis[i] = 0u;\n"
    << "  __syncthreads();\n"
    << "  #pragma unroll 2\n"
    << "  for (int t = 0; t < tiles; ++t) {\n"
    << "    bool seen = false;\n"
    << "    #pragma unroll\n"
    << "    for (int j = 0; j < kBN / 8; ++j)\n"
    << "      #pragma unroll\n"
    << "      for (int e = 0; e < 4; ++e) {\n";
  emit_mask_element(s, p, "        ", "(long long)t * kBN");
  s << "        seen = seen || x != KILN_NEG_INF;\n"
    << "      }\n"
    << "    if (__any_sync(0xffffffffu, seen) && lane == 0) atomicOr(&vis[t >> 5], 1u << (t & 31));\n"
    << "  }\n"
    << "  __syncthreads();\n"
    << "  const int t_first = kiln_next_tile(vis, -1, tiles);\n";
}

void emit_mma(std::ostream& s, const AttentionPlan& p, const std::string& name, AttentionKernel& k) {
  const int warps = mma_warps(p);
  const int threads = 32 * warps;
  const int64_t d = p.head_dim, dv = p.value_dim;
  const bool async = mma_vec16(p);
  const int stages = async ? mma_stages(p) : 1;
  const bool masked = p.mask_kind != AttentionPlan::Mask::kNone;
  const char* mma = p.dtype == engine::DType::kBFloat16 ? "kiln_mma_bf16" : "kiln_mma_f16";
  const char* pack = p.dtype == engine::DType::kBFloat16 ? "kiln_pack_bf16x2" : "kiln_pack_f16x2";
  const int64_t block_rows = 16 * warps;
  auto load_tiles = [&](const std::string& buf, const std::string& n0) {
    emit_tile_load(s, async, "ks[" + buf + "]", "kb", p.k_strides[2], d, "kKs", n0, threads);
    if (async) s << "    kiln_cp_commit();\n";
    emit_tile_load(s, async, "vs[" + buf + "]", "vb", p.v_strides[2], dv, "kVs", n0, threads);
    if (async) s << "    kiln_cp_commit();\n";
  };
  s << signature(p, name, threads) << " {\n"
    << "  constexpr int kD = " << d << ", kDv = " << dv << ", kBN = " << kMmaKeyTile << ", kStages = " << stages
    << ";\n"
    << "  constexpr int kKs = kD + 8, kVs = kDv + 8;  // padded rows: conflict-free fragment loads\n"
    << "  constexpr long long kRows = " << ll(p.rows) << ", kKeys = " << ll(p.keys) << ";\n"
    << "  __shared__ __align__(16) unsigned short ks[kStages][kBN * kKs];\n"
    << "  __shared__ __align__(16) unsigned short vs[kStages][kBN * kVs];\n"
    << "  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;\n";
  emit_bases(s, p);
  if (p.causal)
    s << "  const long long key_end = min(kKeys, (long long)(blockIdx.x + 1) * " << block_rows << ");\n";
  else
    s << "  const long long key_end = kKeys;\n";
  s << "  const int tiles = (int)((key_end + kBN - 1) / kBN);\n"
    << "  const long long row0 = (long long)blockIdx.x * " << block_rows << " + warp * 16;\n";
  if (masked)
    emit_visible_tiles(s, p, threads);
  else
    s << "  const int t_first = 0;\n";
  if (async) {
    s << "  // The first key/value tile is in flight while Q is read.\n"
      << "  if (t_first < tiles) {\n    const long long n0 = (long long)t_first * kBN;\n";
    load_tiles("0", "n0");
    s << "  }\n";
  }
  s << "  // Q as A fragments (16 rows x 16 dims per k-step), straight from memory.\n"
    << "  unsigned qf[kD / 16][4];\n"
    << "  #pragma unroll\n"
    << "  for (int kk = 0; kk < kD / 16; ++kk)\n"
    << "    #pragma unroll\n"
    << "    for (int r = 0; r < 4; ++r) {\n"
    << "      const long long row = row0 + g + (r & 1) * 8;\n"
    << "      const int col = kk * 16 + t4 * 2 + (r >> 1) * 8;\n"
    << "      qf[kk][r] = row < kRows ? *(const unsigned*)(qb + row * " << ll(p.q_strides[2]) << " + col) : 0u;\n"
    << "    }\n"
    << "  float acc[kDv / 8][4];\n"
    << "  #pragma unroll\n"
    << "  for (int j = 0; j < kDv / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;\n"
    << "  float m_run[2] = {KILN_NEG_INF, KILN_NEG_INF}, l_run[2] = {0.0f, 0.0f};\n"
    << "  int t_next = t_first;\n"
    << "  for (int t = t_first, it = 0; t < tiles; t = t_next, ++it) {\n"
    << "    t_next = " << (masked ? "kiln_next_tile(vis, t, tiles)" : "t + 1") << ";\n"
    << "    const long long n0 = (long long)t * kBN;\n"
    << "    const int buf = kStages > 1 ? (it & 1) : 0;\n";
  // A key tile's value wait (async copies) and its end: every warp is done
  // with the buffer before it is refilled (single stage: refilled here).
  // Emitted for computed tiles and for tiles a mask hides alike.
  auto wait_values = [&](const std::string& in) {
    if (async && stages > 1)
      s << in << "if (next) kiln_cp_wait<2>(); else kiln_cp_wait<0>();  // this tile's values\n"
        << in << "__syncthreads();\n";
    else if (async)
      s << in << "kiln_cp_wait<0>();  // this tile's values\n"
        << in << "__syncthreads();\n";
  };
  auto end_tile = [&](const std::string& in) {
    s << in << "__syncthreads();  // every warp is done with this buffer before it is refilled\n";
    if (async && stages == 1) {
      s << in << "if (t_next < tiles) {\n" << in << "  const long long n1 = (long long)t_next * kBN;\n";
      load_tiles("0", "n1");
      s << in << "}\n";
    }
  };
  if (async && stages > 1) {
    s << "    const bool next = t_next < tiles;\n"
      << "    if (next) {\n      const long long n1 = (long long)t_next * kBN;\n      const int nb = buf ^ 1;\n";
    load_tiles("nb", "n1");
    s << "    }\n"
      << "    if (next) kiln_cp_wait<3>(); else kiln_cp_wait<1>();  // this tile's keys\n";
  } else if (async) {
    s << "    kiln_cp_wait<1>();  // this tile's keys\n";
  } else {
    load_tiles("0", "n0");
  }
  s << "    __syncthreads();\n";
  if (masked) {
    // Mask loads issued before the products so their latency overlaps them.
    s << "    float mk[kBN / 8][4];\n"
      << "    #pragma unroll\n"
      << "    for (int j = 0; j < kBN / 8; ++j)\n"
      << "      #pragma unroll\n"
      << "      for (int e = 0; e < 4; ++e) {\n";
    emit_mask_element(s, p, "        ", "n0");
    s << "        mk[j][e] = x;\n"
      << "      }\n"
      // A tile the mask hides from every row of this warp changes nothing
      // (alpha 1, no mass): its products and softmax update are skipped. A
      // causal mask given as a tensor (a KV-cache prefill over the whole
      // cache) hides most tiles of most rows.
      << "    bool hidden = true;\n"
      << "    #pragma unroll\n"
      << "    for (int j = 0; j < kBN / 8; ++j)\n"
      << "      #pragma unroll\n"
      << "      for (int e = 0; e < 4; ++e) hidden = hidden && mk[j][e] == KILN_NEG_INF;\n"
      << "    if (__all_sync(0xffffffffu, hidden)) {\n";
    // the same waits, barrier and refill as a computed tile, so the
    // pipeline is in the same state after either
    wait_values("      ");
    end_tile("      ");
    s << "      continue;\n"
      << "    }\n";
  }
  s << "    float sc[kBN / 8][4];\n"
    << "    #pragma unroll\n"
    << "    for (int j = 0; j < kBN / 8; ++j) {\n"
    << "      sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;\n"
    << "      #pragma unroll\n"
    << "      for (int kk = 0; kk < kD / 16; ++kk) {\n"
    << "        const unsigned short* kp = ks[buf] + (j * 8 + g) * kKs + kk * 16 + t4 * 2;\n"
    << "        " << mma << "(sc[j], qf[kk], *(const unsigned*)kp, *(const unsigned*)(kp + 8));\n"
    << "      }\n"
    << "    }\n"
    << "    // Scores in base 2 with the scale folded in; masked keys to -inf.\n"
    << "    #pragma unroll\n"
    << "    for (int j = 0; j < kBN / 8; ++j)\n"
    << "      #pragma unroll\n"
    << "      for (int e = 0; e < 4; ++e) {\n"
    << "        const long long row = row0 + g + (e >> 1) * 8, key = n0 + j * 8 + t4 * 2 + (e & 1);\n"
    << "        float x = sc[j][e] * " << codegen::float_literal(p.scale * kLog2e) << ";\n";
  if (masked) s << "        x += mk[j][e];\n";
  s << "        if (key >= kKeys) x = KILN_NEG_INF;\n";
  if (p.causal) s << "        if (key > row) x = KILN_NEG_INF;\n";
  s << "        sc[j][e] = x;\n"
    << "        (void)row;\n"
    << "      }\n"
    << "    // Online softmax: rows g (e = 0, 1) and g + 8 (e = 2, 3); a row's 64\n"
    << "    // scores are spread over the 4 lanes of its group.\n"
    << "    #pragma unroll\n"
    << "    for (int r = 0; r < 2; ++r) {\n"
    << "      float mx = KILN_NEG_INF;\n"
    << "      #pragma unroll\n"
    << "      for (int j = 0; j < kBN / 8; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * r], sc[j][2 * r + 1]));\n"
    << "      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));\n"
    << "      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));\n"
    << "      const float m_new = fmaxf(m_run[r], mx);\n"
    << "      const float base = m_new == KILN_NEG_INF ? 0.0f : m_new;\n"
    << "      const float alpha = exp2f(m_run[r] - base);\n"
    << "      float sum = 0.0f;\n"
    << "      #pragma unroll\n"
    << "      for (int j = 0; j < kBN / 8; ++j) {\n"
    << "        sc[j][2 * r] = exp2f(sc[j][2 * r] - base);\n"
    << "        sc[j][2 * r + 1] = exp2f(sc[j][2 * r + 1] - base);\n"
    << "        sum += sc[j][2 * r] + sc[j][2 * r + 1];\n"
    << "      }\n"
    << "      sum += __shfl_xor_sync(0xffffffffu, sum, 1);\n"
    << "      sum += __shfl_xor_sync(0xffffffffu, sum, 2);\n"
    << "      l_run[r] = l_run[r] * alpha + sum;\n"
    << "      m_run[r] = m_new;\n"
    << "      #pragma unroll\n"
    << "      for (int j = 0; j < kDv / 8; ++j) { acc[j][2 * r] *= alpha; acc[j][2 * r + 1] *= alpha; }\n"
    << "    }\n";
  wait_values("    ");
  s << "    // O += P V: P's accumulators are already the A fragments' layout.\n"
    << "    #pragma unroll\n"
    << "    for (int kk = 0; kk < kBN / 16; ++kk) {\n"
    << "      unsigned a[4];\n"
    << "      a[0] = " << pack << "(sc[2 * kk][0], sc[2 * kk][1]);\n"
    << "      a[1] = " << pack << "(sc[2 * kk][2], sc[2 * kk][3]);\n"
    << "      a[2] = " << pack << "(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);\n"
    << "      a[3] = " << pack << "(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);\n"
    << "      #pragma unroll\n"
    << "      for (int j = 0; j < kDv / 8; ++j) {\n"
    << "        unsigned b0, b1;\n"
    << "        kiln_ldsm_x2_trans(b0, b1, vs[buf] + (kk * 16 + (lane & 15)) * kVs + j * 8);\n"
    << "        " << mma << "(acc[j], a, b0, b1);\n"
    << "      }\n"
    << "    }\n";
  end_tile("    ");
  s << "  }\n"
    << "  #pragma unroll\n"
    << "  for (int r = 0; r < 2; ++r) {\n"
    << "    const long long row = row0 + g + r * 8;\n"
    << "    if (row >= kRows) continue;\n"
    << "    const float inv = l_run[r] > 0.0f ? 1.0f / l_run[r] : 0.0f;\n"
    << "    #pragma unroll\n"
    << "    for (int j = 0; j < kDv / 8; ++j)\n"
    << "      *(unsigned*)(ob + " << out_row_offset(p, "row") << " + j * 8 + t4 * 2) = " << pack
    << "(acc[j][2 * r] * inv, acc[j][2 * r + 1] * inv);\n"
    << "  }\n"
    << "}\n";
  k.grid[0] = static_cast<uint32_t>((p.rows + block_rows - 1) / block_rows);
  k.block = static_cast<uint32_t>(threads);
}

void emit_simt(std::ostream& s, const AttentionPlan& p, const std::string& name, AttentionKernel& k) {
  const int64_t d = p.head_dim, dv = p.value_dim;
  const int64_t per_lane = (dv + 31) / 32;
  s << signature(p, name, 32 * kSimtRowsPerBlock) << " {\n"
    << "  constexpr int kD = " << d << ", kDv = " << dv << ", kBN = " << kSimtKeyTile << ", kPer = " << per_lane
    << ";\n"
    << "  constexpr long long kRows = " << ll(p.rows) << ", kKeys = " << ll(p.keys) << ";\n"
    << "  __shared__ float ks[kBN * (kD + 1)];  // +1: lanes read different keys conflict-free\n"
    << "  __shared__ float vs[kBN * kDv];\n"
    << "  __shared__ float qs[" << kSimtRowsPerBlock << " * kD];\n"
    << "  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n";
  emit_bases(s, p);
  s << "  const long long row = (long long)blockIdx.x * " << kSimtRowsPerBlock << " + warp;\n"
    << "  for (int c = lane; c < kD; c += 32)\n"
    << "    qs[warp * kD + c] = row < kRows ? " << load_expr(p.dtype, "qb[row * " + ll(p.q_strides[2]) + " + c]")
    << " : 0.0f;\n"
    << "  float acc[kPer];\n"
    << "  #pragma unroll\n"
    << "  for (int i = 0; i < kPer; ++i) acc[i] = 0.0f;\n"
    << "  float m_run = KILN_NEG_INF, l_run = 0.0f;\n";
  if (p.causal)
    s << "  const long long key_end = min(kKeys, (long long)(blockIdx.x + 1) * " << kSimtRowsPerBlock << ");\n";
  else
    s << "  const long long key_end = kKeys;\n";
  s << "  for (long long n0 = 0; n0 < key_end; n0 += kBN) {\n"
    << "    __syncthreads();\n"
    << "    for (int c = threadIdx.x; c < kBN * kD; c += " << 32 * kSimtRowsPerBlock << ") {\n"
    << "      const int r = c / kD, col = c % kD;\n"
    << "      const long long key = n0 + r;\n"
    << "      ks[r * (kD + 1) + col] = key < kKeys ? "
    << load_expr(p.dtype, "kb[key * " + ll(p.k_strides[2]) + " + col]") << " : 0.0f;\n"
    << "    }\n"
    << "    for (int c = threadIdx.x; c < kBN * kDv; c += " << 32 * kSimtRowsPerBlock << ") {\n"
    << "      const int r = c / kDv, col = c % kDv;\n"
    << "      const long long key = n0 + r;\n"
    << "      vs[r * kDv + col] = key < kKeys ? " << load_expr(p.dtype, "vb[key * " + ll(p.v_strides[2]) + " + col]")
    << " : 0.0f;\n"
    << "    }\n"
    << "    __syncthreads();\n"
    << "    const long long key = n0 + lane;\n"
    << "    float x = 0.0f;\n"
    << "    #pragma unroll 8\n"
    << "    for (int c = 0; c < kD; ++c) x = fmaf(qs[warp * kD + c], ks[lane * (kD + 1) + c], x);\n"
    << "    x *= " << codegen::float_literal(p.scale * kLog2e) << ";\n"
    << "    if (key >= kKeys) x = KILN_NEG_INF;\n";
  if (p.causal) s << "    if (key > row) x = KILN_NEG_INF;\n";
  if (p.mask_kind != AttentionPlan::Mask::kNone)
    s << "    else if (row < kRows) { " << mask_update(p, "row", "key") << " }\n";
  s << "    float mx = x;\n"
    << "    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));\n"
    << "    const float m_new = fmaxf(m_run, mx);\n"
    << "    const float base = m_new == KILN_NEG_INF ? 0.0f : m_new;\n"
    << "    const float alpha = exp2f(m_run - base);\n"
    << "    const float pr = exp2f(x - base);\n"
    << "    float sum = pr;\n"
    << "    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);\n"
    << "    l_run = l_run * alpha + sum;\n"
    << "    m_run = m_new;\n"
    << "    #pragma unroll\n"
    << "    for (int i = 0; i < kPer; ++i) acc[i] *= alpha;\n"
    << "    for (int j = 0; j < kBN; ++j) {\n"
    << "      const float pj = __shfl_sync(0xffffffffu, pr, j);\n"
    << "      #pragma unroll\n"
    << "      for (int i = 0; i < kPer; ++i)\n"
    << "        if (lane + 32 * i < kDv) acc[i] = fmaf(pj, vs[j * kDv + lane + 32 * i], acc[i]);\n"
    << "    }\n"
    << "  }\n"
    << "  if (row >= kRows) return;\n"
    << "  const float inv = l_run > 0.0f ? 1.0f / l_run : 0.0f;\n"
    << "  #pragma unroll\n"
    << "  for (int i = 0; i < kPer; ++i)\n"
    << "    if (lane + 32 * i < kDv) ob[" << out_row_offset(p, "row") << " + lane + 32 * i] = "
    << store_expr(p.dtype, "acc[i] * inv") << ";\n"
    << "}\n";
  k.grid[0] = static_cast<uint32_t>((p.rows + kSimtRowsPerBlock - 1) / kSimtRowsPerBlock);
  k.block = 32 * kSimtRowsPerBlock;
}

}  // namespace

bool attention_uses_mma(const AttentionPlan& p) {
  if (!p.tensor_cores) return false;
  if (p.dtype != engine::DType::kFloat16 && p.dtype != engine::DType::kBFloat16) return false;
  if (p.head_dim % 16 != 0 || p.value_dim % 16 != 0) return false;
  if (p.head_dim > kAttnMaxHeadDim || p.value_dim > kAttnMaxHeadDim) return false;
  // 32-bit fragment loads and stores: every stride even.
  for (const auto* st : {&p.q_strides, &p.k_strides, &p.v_strides, &p.out_strides})
    for (int64_t x : *st)
      if (x % 2 != 0) return false;
  if (p.offsets[0] % 2 != 0 || p.offsets[1] % 2 != 0 || p.offsets[2] % 2 != 0) return false;
  return p.out_row_block_stride % 2 == 0;
}

AttentionKernel generate_attention_kernel(const AttentionPlan& p, const std::string& name) {
  AttentionKernel k;
  std::ostringstream s;
  s << kHelpers << "// " << name << ": attention [" << p.batch << "," << p.heads << "," << p.rows << "," << p.head_dim
    << "] x " << p.keys << " keys" << (p.causal ? ", causal" : "") << "\n"
    << "#define T " << storage_type(p.dtype) << "\n";
  if (p.mask_kind != AttentionPlan::Mask::kNone) s << "#define M " << storage_type(p.dtype_mask) << "\n";
  if (attention_is_decode(p))
    emit_decode(s, p, name, k);
  else if (attention_uses_mma(p))
    emit_mma(s, p, name, k);
  else
    emit_simt(s, p, name, k);
  s << "#undef T\n";
  if (p.mask_kind != AttentionPlan::Mask::kNone) s << "#undef M\n";
  k.source = s.str();
  k.grid[1] = static_cast<uint32_t>(p.heads);
  k.grid[2] = static_cast<uint32_t>(p.batch);
  return k;
}

}  // namespace kiln::ops
