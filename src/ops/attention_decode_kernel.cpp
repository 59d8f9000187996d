// Decode-shaped attention kernels (attention_kernel.h): the split-keys
// kernel and the combine kernel that merges its splits.
#include <algorithm>
#include <sstream>

#include "codegen/cuda_dtype.h"
#include "codegen/grid_dependency.h"
#include "ops/attention_kernel.h"
#include "ops/attention_kernel_parts.h"

namespace kiln::ops {
using codegen::load_expr;
using codegen::storage_type;
using codegen::store_expr;

namespace attention_detail {
namespace {

// Decode-shaped attention (a few query rows per head, many keys: one new
// token over a KV cache). The row-tiled kernels would give each head one
// small block walking every key; here a block's warps split the keys, 32 at
// a time (a lane scores one key for every row, then the lanes accumulate
// their slice of the output over those keys), and the warps' partial
// softmax states are merged in shared memory at the end.
// Keys each of `splits` blocks walks: a whole number of 32-key steps.
int64_t keys_per_split(int64_t keys, int64_t splits) { return ((keys + splits - 1) / splits + 31) / 32 * 32; }

int64_t split_keys(const AttentionPlan& p) {  // keys one block walks
  return p.splits > 1 ? keys_per_split(p.keys, p.splits) : p.keys;
}

int decode_warps(const AttentionPlan& p) {
  const int64_t per_warp = p.rows * (p.value_dim + 2) * 4;  // merge state bytes
  const int64_t keys = split_keys(p);
  for (int warps : {16, 8, 4, 2})
    if (warps * per_warp <= 40 * 1024 && keys >= 32 * warps) return warps;
  return p.splits > 1 ? 1 : 4;
}

}  // namespace

void emit_decode(std::ostream& s, const AttentionPlan& p, const std::string& name, AttentionKernel& k) {
  const int64_t d = p.head_dim, dv = p.value_dim, rows = p.rows;
  const int64_t per_lane = (dv + 31) / 32;
  const int warps = decode_warps(p);
  // Value rows as one vector a lane (its kPer dims side by side) when they
  // split evenly over the lanes and every row start keeps the vector aligned.
  const int64_t v_bytes = per_lane * static_cast<int64_t>(engine::dtype_size(p.dtype));
  const char* v_vec = nullptr;
  if (dv == 32 * per_lane && (p.v_strides[2] * static_cast<int64_t>(engine::dtype_size(p.dtype))) % v_bytes == 0 &&
      (p.v_strides[1] * static_cast<int64_t>(engine::dtype_size(p.dtype))) % v_bytes == 0 &&
      (p.v_strides[0] * static_cast<int64_t>(engine::dtype_size(p.dtype))) % v_bytes == 0 &&
      (p.offsets[2] * static_cast<int64_t>(engine::dtype_size(p.dtype))) % v_bytes == 0)
    v_vec = v_bytes == 2 ? "unsigned short" : v_bytes == 4 ? "unsigned int" : v_bytes == 8 ? "uint2"
          : v_bytes == 16 ? "uint4" : nullptr;
  const std::string dim = v_vec != nullptr ? "lane * kPer + i" : "lane + 32 * i";
  // Value rows whose loads a lane keeps in flight: the first group's are
  // issued with the step's key row, before the scores they do not depend on
  // (one memory latency a step instead of one for the keys and one a group),
  // up to 128 bytes of registers a lane (a whole 32-key step for 4-byte vectors).
  const int64_t v_group = v_vec != nullptr ? std::clamp<int64_t>(128 / v_bytes, 8, 32) : 8;
  s << signature(p, name, 32 * warps) << " {\n"
    << "  constexpr int kD = " << d << ", kDv = " << dv << ", kR = " << rows << ", kPer = " << per_lane
    << ", kWarps = " << warps << ", kVG = " << v_group << ";\n"
    << "  constexpr long long kKeys = " << ll(p.keys) << ";\n"
    << "  __shared__ float qs[kR * kD];\n"
    << "  __shared__ float part[kWarps * kR * (kDv + 2)];  // per warp and row: max, sum, output\n"
    << "  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;\n";
  emit_bases(s, p);
  if (p.prefetch_before_wait) {
    // Every cache row but the current position's is constant during a decode
    // step, and the kernel before this one (the cache write) is writing that
    // row now. A prefetch into L2 reads nothing into the kernel: L2 is where
    // global memory is coherent, so a row written after its prefetch is read
    // fresh after the wait. The block's key and value rows (each contiguous,
    // whole 128-byte lines from its start) go to L2 while the predecessor
    // runs; the scores' loads then hit L2.
    const int64_t esize = static_cast<int64_t>(engine::dtype_size(p.dtype));
    const std::string first = p.splits > 1 ? "(long long)blockIdx.x * " + ll(split_keys(p)) : std::string("0LL");
    const std::string last = p.splits > 1 ? "min(kKeys, " + first + " + " + ll(split_keys(p)) + ")" : "kKeys";
    s << "#ifdef __CUDA_ARCH__  // a hint: the host tests' build of the kernel leaves it out\n"
      << "  for (long long n = " << first << " + threadIdx.x; n < " << last << "; n += " << 32 * warps << ") {\n"
      << "    const char* kr = reinterpret_cast<const char*>(kb + n * " << ll(p.k_strides[2]) << ");\n"
      << "    const char* vr = reinterpret_cast<const char*>(vb + n * " << ll(p.v_strides[2]) << ");\n"
      << "    for (int o = 0; o < " << d * esize << "; o += 128) asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"(kr + o));\n"
      << "    for (int o = 0; o < " << dv * esize << "; o += 128) asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"(vr + o));\n"
      << "  }\n"
      << "#endif\n"
      << "  " << codegen::grid_dependency_wait() << "\n";
  }
  s << "  for (int c = threadIdx.x; c < kR * kD; c += " << 32 * warps << ")\n"
    << "    qs[c] = " << load_expr(p.dtype, "qb[(long long)(c / kD) * " + ll(p.q_strides[2]) + " + c % kD]") << ";\n"
    << "  __syncthreads();\n"
    << "  float m_run[kR], l_run[kR], acc[kR][kPer];\n"
    << "  #pragma unroll\n"
    << "  for (int r = 0; r < kR; ++r) {\n"
    << "    m_run[r] = KILN_NEG_INF; l_run[r] = 0.0f;\n"
    << "    #pragma unroll\n"
    << "    for (int i = 0; i < kPer; ++i) acc[r][i] = 0.0f;\n"
    << "  }\n";
  // This block's keys: all, or its split's [kBegin, kEnd).
  if (p.splits > 1)
    s << "  const long long kBegin = (long long)blockIdx.x * " << ll(split_keys(p))
      << ", kEnd = min(kKeys, kBegin + " << ll(split_keys(p)) << ");\n";
  else
    s << "  const long long kBegin = 0, kEnd = kKeys;\n";
  s << "  for (long long n0 = kBegin + (long long)warp * 32; n0 < kEnd; n0 += 32 * kWarps) {\n"
    << "    const long long key = n0 + lane;\n";
  if (v_vec != nullptr)
    s << "    " << v_vec << " vfirst[kVG];  // the step's first value rows, loaded before the scores\n"
      << "    #pragma unroll\n"
      << "    for (int jj = 0; jj < kVG; ++jj)\n"
      << "      if (n0 + jj < kEnd) vfirst[jj] = *reinterpret_cast<const " << v_vec << "*>(vb + (n0 + jj) * "
      << ll(p.v_strides[2]) << " + lane * kPer);\n";
  s << "    float x[kR];\n"
    << "    #pragma unroll\n"
    << "    for (int r = 0; r < kR; ++r) x[r] = 0.0f;\n"
    << "    if (key < kEnd) {\n"
    << "      const T* kr = kb + key * " << ll(p.k_strides[2]) << ";\n";
  // A lane reads its key's whole row: 16-byte loads, all issued before the
  // products, when every row starts 16-byte aligned.
  const int64_t esize = static_cast<int64_t>(engine::dtype_size(p.dtype)), vec = 16 / esize;
  const bool wide = d % vec == 0 && (p.k_strides[2] * esize) % 16 == 0 && (p.k_strides[1] * esize) % 16 == 0 &&
                    (p.k_strides[0] * esize) % 16 == 0 && (p.offsets[1] * esize) % 16 == 0;
  if (wide)
    s << "      uint4 w[kD / " << vec << "];\n"
      << "      #pragma unroll\n"
      << "      for (int c = 0; c < kD / " << vec << "; ++c) w[c] = reinterpret_cast<const uint4*>(kr)[c];\n"
      << "      #pragma unroll\n"
      << "      for (int c = 0; c < kD; ++c) {\n"
      << "        const float kv = " << load_expr(p.dtype, "reinterpret_cast<const T*>(w)[c]") << ";\n";
  else
    s << "      #pragma unroll 8\n"
      << "      for (int c = 0; c < kD; ++c) {\n"
      << "        const float kv = " << load_expr(p.dtype, "kr[c]") << ";\n";
  s << "        #pragma unroll\n"
    << "        for (int r = 0; r < kR; ++r) x[r] = fmaf(qs[r * kD + c], kv, x[r]);\n"
    << "      }\n"
    << "    }\n"
    << "    #pragma unroll\n"
    << "    for (int r = 0; r < kR; ++r) {\n"
    << "      x[r] *= " << codegen::float_literal(p.scale * kLog2e) << ";\n"
    << "      if (key >= kEnd) x[r] = KILN_NEG_INF;\n";
  if (p.causal) s << "      else if (key > r) x[r] = KILN_NEG_INF;\n";
  if (p.mask_kind != AttentionPlan::Mask::kNone) {
    std::string upd = mask_update(p, "r", "key");
    // mask_update writes to `x`; here the score is x[r].
    size_t at;
    while ((at = upd.find("x ")) != std::string::npos) upd.replace(at, 2, "x[r] ");
    s << "      else { " << upd << " }\n";
  }
  s << "    }\n"
    << "    float pr[kR];\n"
    << "    #pragma unroll\n"
    << "    for (int r = 0; r < kR; ++r) {\n"
    << "      float mx = x[r];\n"
    << "      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));\n"
    << "      const float m_new = fmaxf(m_run[r], mx);\n"
    << "      const float base = m_new == KILN_NEG_INF ? 0.0f : m_new;\n"
    << "      const float alpha = exp2f(m_run[r] - base);\n"
    << "      pr[r] = exp2f(x[r] - base);\n"
    << "      float sum = pr[r];\n"
    << "      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);\n"
    << "      l_run[r] = l_run[r] * alpha + sum;\n"
    << "      m_run[r] = m_new;\n"
    << "      #pragma unroll\n"
    << "      for (int i = 0; i < kPer; ++i) acc[r][i] *= alpha;\n"
    << "    }\n"
    << "    const int valid = (int)min(32LL, kEnd - n0);\n";
  if (v_vec != nullptr) {
    // Lane owns dims [lane * kPer, lane * kPer + kPer): one vector load per
    // value row, kVG rows' loads in flight before their products.
    s << "    #pragma unroll\n"
      << "    for (int j0 = 0; j0 < 32; j0 += kVG) {\n"
      << "      if (j0 >= valid) break;\n"
      << "      " << v_vec << " vraw[kVG];\n"
      << "      #pragma unroll\n"
      << "      for (int jj = 0; jj < kVG; ++jj)\n"
      << "        if (j0 == 0) vraw[jj] = vfirst[jj];\n"
      << "        else if (j0 + jj < valid) vraw[jj] = *reinterpret_cast<const " << v_vec << "*>(vb + (n0 + j0 + jj) * "
      << ll(p.v_strides[2]) << " + lane * kPer);\n"
      << "      #pragma unroll\n"
      << "      for (int jj = 0; jj < kVG; ++jj) {\n"
      << "        if (j0 + jj >= valid) break;\n"
      << "        const T* ve = reinterpret_cast<const T*>(&vraw[jj]);\n"
      << "        #pragma unroll\n"
      << "        for (int r = 0; r < kR; ++r) {\n"
      << "          const float pj = __shfl_sync(0xffffffffu, pr[r], j0 + jj);\n"
      << "          #pragma unroll\n"
      << "          for (int i = 0; i < kPer; ++i) acc[r][i] = fmaf(pj, " << load_expr(p.dtype, "ve[i]")
      << ", acc[r][i]);\n"
      << "        }\n"
      << "      }\n"
      << "    }\n"
      << "  }\n";
  } else {
    s << "    #pragma unroll 4\n"
      << "    for (int j = 0; j < valid; ++j) {\n"
      << "      const T* vr = vb + (n0 + j) * " << ll(p.v_strides[2]) << ";\n"
      << "      float vv[kPer];\n"
      << "      #pragma unroll\n"
      << "      for (int i = 0; i < kPer; ++i) vv[i] = lane + 32 * i < kDv ? "
      << load_expr(p.dtype, "vr[lane + 32 * i]") << " : 0.0f;\n"
      << "      #pragma unroll\n"
      << "      for (int r = 0; r < kR; ++r) {\n"
      << "        const float pj = __shfl_sync(0xffffffffu, pr[r], j);\n"
      << "        #pragma unroll\n"
      << "        for (int i = 0; i < kPer; ++i) acc[r][i] = fmaf(pj, vv[i], acc[r][i]);\n"
      << "      }\n"
      << "    }\n"
      << "  }\n";
  }
  // With the wait placed (the cache prefetch above it), the successor launches only after the
  // keys: its blocks do not compete with this kernel's loads.
  if (p.prefetch_before_wait) s << "  " << codegen::grid_dependency_trigger() << "\n";
  s
    // Merge: every warp's (max, sum, output) per row, then one pass over (row, dim).
    << "  #pragma unroll\n"
    << "  for (int r = 0; r < kR; ++r) {\n"
    << "    float* w = part + (warp * kR + r) * (kDv + 2);\n"
    << "    if (lane == 0) { w[0] = m_run[r]; w[1] = l_run[r]; }\n"
    << "    #pragma unroll\n"
    << "    for (int i = 0; i < kPer; ++i)\n"
    << "      if (" << dim << " < kDv) w[2 + " << dim << "] = acc[r][i];\n"
    << "  }\n"
    << "  __syncthreads();\n"
    << "  for (int e = threadIdx.x; e < kR * kDv; e += " << 32 * warps << ") {\n"
    << "    const int r = e / kDv, c = e % kDv;\n"
    << "    float m = KILN_NEG_INF;\n"
    << "    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, part[(w * kR + r) * (kDv + 2)]);\n"
    << "    const float base = m == KILN_NEG_INF ? 0.0f : m;\n"
    << "    float l = 0.0f, o = 0.0f;\n"
    << "    for (int w = 0; w < kWarps; ++w) {\n"
    << "      const float* pw = part + (w * kR + r) * (kDv + 2);\n"
    << "      const float f = exp2f(pw[0] - base);\n"
    << "      l = fmaf(pw[1], f, l);\n"
    << "      o = fmaf(pw[2 + c], f, o);\n"
    << "    }\n"
    << (p.splits > 1 ? std::string("    if (c == 0) { pb[r * (kDv + 2)] = m; pb[r * (kDv + 2) + 1] = l; }\n"
                                   "    pb[r * (kDv + 2) + 2 + c] = o;\n")
                     : "    ob[" + out_row_offset(p, "r") + " + c] = " +
                           store_expr(p.dtype, "l > 0.0f ? o / l : 0.0f") + ";\n")
    << "  }\n"
    << "}\n";
  k.grid[0] = static_cast<uint32_t>(p.splits);
  k.block = static_cast<uint32_t>(32 * warps);
}


}  // namespace attention_detail

bool attention_is_decode(const AttentionPlan& p) {
  return p.rows <= kAttnDecodeMaxRows && p.keys >= 128 && p.head_dim <= kAttnMaxHeadDim &&
         p.value_dim <= kAttnMaxHeadDim;
}

int64_t attention_decode_splits(const AttentionPlan& p) {
  if (!attention_is_decode(p)) return 1;
  constexpr int64_t kTargetBlocks = 132;  // an H100/H200's SMs
  const int64_t blocks = p.batch * p.heads;
  const int64_t splits = std::min((kTargetBlocks + blocks - 1) / blocks, p.keys / kAttnSplitMinKeys);
  if (splits <= 1) return 1;
  // A split walks a whole number of 32-key steps, so fewer splits may cover
  // the keys: no block is left without any.
  const int64_t per = attention_detail::keys_per_split(p.keys, splits);
  return (p.keys + per - 1) / per;
}

AttentionKernel generate_attention_combine_kernel(const AttentionPlan& p, const std::string& name) {
  using namespace attention_detail;
  if (p.splits < 2) throw CompileError("internal: attention combine of an unsplit plan");
  const int64_t per = p.value_dim + 2, items = p.rows * p.value_dim;
  const int threads = static_cast<int>(std::min<int64_t>(1024, (items + 31) / 32 * 32));
  const std::string T = storage_type(p.dtype);
  std::ostringstream s;
  s << "// " << name << ": merges " << p.splits << " key splits of a decode attention\n"
    << "extern \"C\" __global__ void __launch_bounds__(" << threads << ") " << name
    << "(const float* __restrict__ partials, " << T << "* __restrict__ out) {\n"
    << "  const long long b = blockIdx.z, h = blockIdx.y;\n"
    << "  const float* pb = partials + (b * " << ll(p.heads) << " + h) * " << ll(p.splits * p.rows * per) << ";\n"
    << "  " << T << "* ob = out + b * " << ll(p.out_strides[0]) << " + h * " << ll(p.out_strides[1]) << ";\n"
    << "  for (int e = threadIdx.x; e < " << items << "; e += " << threads << ") {\n"
    << "    const int r = e / " << p.value_dim << ", c = e % " << p.value_dim << ";\n"
    << "    float m = -__int_as_float(0x7f800000);\n"
    << "    for (int sp = 0; sp < " << p.splits << "; ++sp) m = fmaxf(m, pb[(sp * " << p.rows << " + r) * " << per
    << "]);\n"
    << "    const float base = m == -__int_as_float(0x7f800000) ? 0.0f : m;\n"
    << "    float l = 0.0f, o = 0.0f;\n"
    << "    for (int sp = 0; sp < " << p.splits << "; ++sp) {\n"
    << "      const float* ps = pb + (sp * " << p.rows << " + r) * " << per << ";\n"
    << "      const float f = exp2f(ps[0] - base);\n"
    << "      l = fmaf(ps[1], f, l);\n"
    << "      o = fmaf(ps[2 + c], f, o);\n"
    << "    }\n"
    << "    ob[" << out_row_offset(p, "r") << " + c] = " << store_expr(p.dtype, "l > 0.0f ? o / l : 0.0f")
    << ";\n"
    << "  }\n"
    << "}\n";
  AttentionKernel k;
  k.source = s.str();
  k.grid[1] = static_cast<uint32_t>(p.heads);
  k.grid[2] = static_cast<uint32_t>(p.batch);
  k.block = static_cast<uint32_t>(threads);
  return k;
}

}  // namespace kiln::ops
