#include "ops/gemv_kernel.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "codegen/cuda_dtype.h"
#include "codegen/grid_dependency.h"
#include "ops/elementwise_kernel.h"
#include "ops/step_plan.h"

namespace kiln::ops {
namespace {

constexpr int kGemvWarps = 4;       // warps a block; one output column each
constexpr int64_t kGemvGroup = 8;   // 16-byte loads a lane keeps in flight

// The wide shape of a plain product (no norm prologue, no pair): a warp owns
// kWideColumns columns and a kWideSplit-th of their rows, kWideWarps warps a
// block, the split partial sums added in shared memory. Each lane then keeps
// kWideColumns x its loads in flight, twice the bytes of one column a warp:
// it is what the product with few columns lacks (benchmarks/micro/
// gemv_chain_shapes.cu, H100: k = 4096, n = 1024 takes 4.8 us against 5.6;
// k = 1024, n = 1024 2.05 against 2.24). With many columns the one-column
// shape has enough warps in flight already (n = 8192: equal), so the wide
// shape is kept to n <= kWideMaxColumns.
constexpr int kWideColumns = 4, kWideWarps = 8, kWideSplit = 4;
constexpr int64_t kWideMaxColumns = 2048;

using codegen::ll;

bool relu_of(engine::GemmEpilogue e) {
  return e == engine::GemmEpilogue::kRelu || e == engine::GemmEpilogue::kReluBias;
}

// Whether the plain product takes the wide shape: few columns, and rows that
// split into kWideSplit slices of at least one vector a lane.
bool wide_shape(const GemmPlan& p, int64_t vecs) {
  return !p.paired && !p.rms_norm && p.n <= kWideMaxColumns && vecs % kWideSplit == 0 &&
         vecs / kWideSplit >= 32;
}

// `r` (row m, column col) through the bias, the addend and the ReLU, then stored.
void emit_plain_store(std::ostringstream& s, const GemmPlan& p, engine::DType dtype, const std::string& indent) {
  if (p.bias >= 0) s << indent << "r += " << codegen::load_expr(dtype, "bias[col]") << ";\n";
  if (p.c >= 0) s << indent << "r += " << codegen::load_expr(dtype, "c[m * kN + col]") << ";\n";
  if (relu_of(p.epilogue)) s << indent << "r = kiln_relu(r);\n";
  s << indent << "out[m * kN + col] = " << codegen::store_expr(dtype, "r") << ";\n";
}

// `code` (lines) with `indent` before each line.
std::string indented(const std::string& code, const std::string& indent) {
  std::istringstream in(code);
  std::ostringstream out;
  for (std::string line; std::getline(in, line);) out << indent << line << "\n";
  return out.str();
}

// GemmPlan::early_weights: the first group's loads (`load`, for `base`), and
// then the kernel's grid-dependency wait (codegen/grid_dependency.h): the
// weights are constants, so they are read while the predecessor still runs.
void emit_early_loads(std::ostringstream& s, const std::string& load) {
  s << "  // The weights are constants: their first loads are issued before this kernel waits for its\n"
    << "  // predecessor (with programmatic launch on sm_90+; a comment elsewhere).\n"
    << "  {\n"
    << "    const long long base = lane;\n"
    << indented(load, "    ") << "  }\n"
    << "  " << codegen::grid_dependency_wait() << "\n";
}

// The wide shape (see kWideColumns), for a product with neither a norm
// prologue nor a pair epilogue.
GemvKernel generate_wide_gemv(const GemmPlan& p, engine::DType dtype, const std::string& name, int64_t vec,
                              int64_t vecs) {
  const int64_t slice = vecs / kWideSplit;  // vectors of a row a warp reads
  const int64_t group = std::min<int64_t>(kGemvGroup / 2, (slice + 31) / 32);
  const std::string T = codegen::storage_type(dtype);
  std::ostringstream s;
  s << "// " << name << ": gemv m=" << p.m << " n=" << p.n << " k=" << p.k << ", " << kWideColumns
    << " columns a warp, rows split over " << kWideSplit << " warps\n"
    << "extern \"C\" __global__ void __launch_bounds__(" << 32 * kWideWarps << ") " << name << "(\n"
    << "    " << T << "* __restrict__ out, const " << T << "* __restrict__ x, const " << T << "* __restrict__ w";
  if (p.bias >= 0) s << ", const " << T << "* __restrict__ bias";
  if (p.c >= 0) s << ", const " << T << "* __restrict__ c";
  s << ") {\n"
    << "  constexpr int kM = " << p.m << ", kG = " << group << ", kV = " << vec << ", kC = " << kWideColumns
    << ", kS = " << kWideSplit << ", kW = " << kWideWarps << ";\n"
    << "  constexpr long long kN = " << ll(p.n) << ", kK = " << ll(p.k) << ", kSlice = " << ll(slice) << ";\n"
    << "  __shared__ float partial[kW][kM * kC];\n"
    << "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % kS;\n"
    << "  const long long col0 = ((long long)blockIdx.x * (kW / kS) + warp / kS) * kC;\n"
    << "  const long long v0 = part * kSlice;  // this warp's slice of each row, in vectors\n"
    << "  float acc[kM][kC];\n"
    << "  #pragma unroll\n"
    << "  for (int m = 0; m < kM; ++m)\n"
    << "    #pragma unroll\n"
    << "    for (int j = 0; j < kC; ++j) acc[m][j] = 0.0f;\n"
    << "  uint4 wv[kC][kG];\n";
  // The loads of the group at `base`.
  const std::string load =
      "#pragma unroll\n"
      "for (int j = 0; j < kC; ++j)\n"
      "  #pragma unroll\n"
      "  for (int g = 0; g < kG; ++g) {\n"
      "    const long long v = base + 32 * g;\n"
      "    wv[j][g] = v < kSlice && col0 + j < kN\n"
      "        ? __ldg(reinterpret_cast<const uint4*>(w + (col0 + j) * kK) + v0 + v)\n"
      "        : make_uint4(0u, 0u, 0u, 0u);\n"
      "  }\n";
  if (p.early_weights) emit_early_loads(s, load);
  s << "  for (long long base = lane; base < kSlice; base += 32 * kG) {\n";
  if (p.early_weights) s << "    if (base != lane) {\n" << indented(load, "      ") << "    }\n";
  else s << indented(load, "    ");
  s
    << "    #pragma unroll\n"
    << "    for (int g = 0; g < kG; ++g) {\n"
    << "      const long long v = base + 32 * g;\n"
    << "      if (v >= kSlice) break;\n"
    << "      #pragma unroll\n"
    << "      for (int m = 0; m < kM; ++m) {\n"
    << "        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + m * kK) + v0 + v);\n"
    << "        const " << T << "* xe = reinterpret_cast<const " << T << "*>(&xv);\n"
    << "        #pragma unroll\n"
    << "        for (int j = 0; j < kC; ++j) {\n"
    << "          const " << T << "* we = reinterpret_cast<const " << T << "*>(&wv[j][g]);\n"
    << "          #pragma unroll\n"
    << "          for (int e = 0; e < kV; ++e) acc[m][j] = fmaf(" << codegen::load_expr(dtype, "we[e]") << ", "
    << codegen::load_expr(dtype, "xe[e]") << ", acc[m][j]);\n"
    << "        }\n"
    << "      }\n"
    << "    }\n"
    << "  }\n"
    << "  #pragma unroll\n"
    << "  for (int m = 0; m < kM; ++m)\n"
    << "    #pragma unroll\n"
    << "    for (int j = 0; j < kC; ++j) {\n"
    << "      float a = acc[m][j];\n"
    << "      for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);\n"
    << "      if (lane == 0) partial[warp][m * kC + j] = a;\n"
    << "    }\n"
    << "  __syncthreads();\n"
    << "  // The first warp of each split adds the slices, a (row, column) a lane.\n"
    << "  if (part != 0 || lane >= kM * kC) return;\n"
    << "  const int m = lane / kC;\n"
    << "  const long long col = col0 + lane % kC;\n"
    << "  if (col >= kN) return;\n"
    << "  float r = 0.0f;\n"
    << "  #pragma unroll\n"
    << "  for (int q = 0; q < kS; ++q) r += partial[warp + q][lane];\n";
  emit_plain_store(s, p, dtype, "  ");
  s << "}\n";
  GemvKernel k;
  k.source = s.str();
  const int64_t per_block = kWideColumns * kWideWarps / kWideSplit;
  k.grid = static_cast<uint32_t>((p.n + per_block - 1) / per_block);
  k.block = 32 * kWideWarps;
  return k;
}

}  // namespace

bool gemv_applies(const GemmPlan& p, engine::DType dtype) {
  if (dtype != engine::DType::kFloat32 && dtype != engine::DType::kFloat16 && dtype != engine::DType::kBFloat16)
    return false;
  if (p.batch != 1 || !p.b_transposed || p.alpha != 1.0f || p.m < 1 || p.m > kGemvMaxRows || p.n < 1) return false;
  if (p.c >= 0 ? p.beta != 1.0f : p.beta != 0.0f) return false;
  if (p.c >= 0 && relu_of(p.epilogue)) return false;  // cuBLASLt's order (act after C) is not planned together
  const int64_t vec = 16 / static_cast<int64_t>(engine::dtype_size(dtype));
  return p.k % vec == 0 && p.k / vec >= 16 && p.n <= 0x7fffffffLL * kGemvWarps;
}

namespace {

// What the one-column and the strided kernels share: the signature, the
// RMSNorm prologue and the store of a column's sums (`acc`, `acc2` reduced
// over the lanes; `col` the column, `m` the row).
struct GemvText {
  const GemmPlan& p;
  engine::DType dtype, out_dtype, norm_weight_dtype;
  const ir::Graph* graph;
  std::string name, T;
  bool pair, norm, norm_weight;

  void signature(std::ostringstream& s, int warps) const {
    s << "extern \"C\" __global__ void __launch_bounds__(" << 32 * warps << ") " << name << "(\n"
      << "    " << codegen::storage_type(out_dtype) << "* __restrict__ out, const " << T << "* __restrict__ x, const "
      << T << "* __restrict__ w";
    if (p.bias >= 0) s << ", const " << T << "* __restrict__ bias";
    if (p.c >= 0) s << ", const " << T << "* __restrict__ c";
    if (norm_weight) s << ", const " << codegen::storage_type(norm_weight_dtype) << "* __restrict__ nw";
    s << ") {\n";
  }

  // RMSNorm prologue: each warp computes its rows' rsqrt(mean(x^2) + eps)
  // (a row is a few KiB, read from cache by every warp); the products then
  // take x * weight and the sum is scaled once by the row's factor.
  void norm_prologue(std::ostringstream& s) const {
    if (!norm) return;
    char eps[32];
    std::snprintf(eps, sizeof(eps), "%.9e", p.norm_eps);  // always a float literal
    s << "  float rs[kM];\n"
      << "  #pragma unroll\n"
      << "  for (int m = 0; m < kM; ++m) rs[m] = 0.0f;\n"
      << "  for (long long v = lane; v < kVecs; v += 32) {\n"
      << "    #pragma unroll\n"
      << "    for (int m = 0; m < kM; ++m) {\n"
      << "      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + m * kK) + v);\n"
      << "      const " << T << "* xe = reinterpret_cast<const " << T << "*>(&xv);\n"
      << "      #pragma unroll\n"
      << "      for (int e = 0; e < kV; ++e) {\n"
      << "        const float t = " << codegen::load_expr(dtype, "xe[e]") << ";\n"
      << "        rs[m] = fmaf(t, t, rs[m]);\n"
      << "      }\n"
      << "    }\n"
      << "  }\n"
      << "  #pragma unroll\n"
      << "  for (int m = 0; m < kM; ++m) {\n"
      << "    float a = rs[m];\n"
      << "    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);\n"
      << "    rs[m] = rsqrtf(a / (float)kK + " << eps << "f);\n"
      << "  }\n";
  }

  // The terms of the vectors wv[g] (wv2[g]) at `base + 32 * g` added to acc (acc2).
  void sum_group(std::ostringstream& s, const std::string& in) const {
    const std::string x_term = norm_weight ? codegen::load_expr(dtype, "xe[e]") + " * " +
                                                 codegen::load_expr(norm_weight_dtype, "nw[v * kV + e]")
                                           : codegen::load_expr(dtype, "xe[e]");
    s << in << "#pragma unroll\n"
      << in << "for (int g = 0; g < kG; ++g) {\n"
      << in << "  const long long v = base + 32 * g;\n"
      << in << "  if (v >= kVecs) break;\n"
      << in << "  const " << T << "* we = reinterpret_cast<const " << T << "*>(&wv[g]);\n"
      << (pair ? in + "  const " + T + "* we2 = reinterpret_cast<const " + T + "*>(&wv2[g]);\n" : std::string())
      << in << "  #pragma unroll\n"
      << in << "  for (int m = 0; m < kM; ++m) {\n"
      << in << "    const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + m * kK) + v);\n"
      << in << "    const " << T << "* xe = reinterpret_cast<const " << T << "*>(&xv);\n"
      << in << "    #pragma unroll\n";
    if (pair)
      s << in << "    for (int e = 0; e < kV; ++e) {\n"
        << in << "      const float xf = " << x_term << ";\n"
        << in << "      acc[m] = fmaf(" << codegen::load_expr(dtype, "we[e]") << ", xf, acc[m]);\n"
        << in << "      acc2[m] = fmaf(" << codegen::load_expr(dtype, "we2[e]") << ", xf, acc2[m]);\n"
        << in << "    }\n";
    else
      s << in << "    for (int e = 0; e < kV; ++e) acc[m] = fmaf(" << codegen::load_expr(dtype, "we[e]") << ", " << x_term
        << ", acc[m]);\n";
    s << in << "  }\n" << in << "}\n";
  }

  // acc (acc2) summed over the lanes, in every lane.
  void reduce(std::ostringstream& s, const std::string& in) const {
    s << in << "#pragma unroll\n"
      << in << "for (int m = 0; m < kM; ++m) {\n"
      << in << "  float a = acc[m];\n"
      << in << "  for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);\n"
      << in << "  acc[m] = a;\n"
      << (pair ? in + "  float a2 = acc2[m];\n" + in +
                     "  for (int o = 16; o > 0; o >>= 1) a2 += __shfl_xor_sync(0xffffffffu, a2, o);\n" + in +
                     "  acc2[m] = a2;\n"
               : std::string())
      << in << "}\n";
  }

  // Lane 0's stores of column `col` for every row.
  void store(std::ostringstream& s, const std::string& in) const {
    s << in << "#pragma unroll\n"
      << in << "for (int m = 0; m < kM; ++m) {\n"
      << in << "  float r = acc[m]" << (norm ? " * rs[m]" : "") << ";\n";
    const std::string i2 = in + "  ";
    if (!pair) {
      emit_plain_store(s, p, dtype, i2);
    } else {
      if (p.bias >= 0) s << i2 << "r += " << codegen::load_expr(dtype, "bias[col]") << ";\n";
      // The two halves as the product's dtype stores them (what the separate
      // elementwise kernel read), then its arithmetic.
      s << i2 << "float r2 = acc2[m]" << (norm ? " * rs[m]" : "") << ";\n";
      if (p.bias >= 0) s << i2 << "r2 += " << codegen::load_expr(dtype, "bias[col + kHalf]") << ";\n";
      s << i2 << "const " << T << " q1 = " << codegen::store_expr(dtype, "r") << ";\n"
        << i2 << "const " << T << " q2 = " << codegen::store_expr(dtype, "r2") << ";\n"
        << i2 << "const float h1 = " << codegen::load_expr(dtype, "q1") << ", h2 = " << codegen::load_expr(dtype, "q2")
        << ";\n";
      std::map<int, std::string> name_of{{p.pair_first, "h1"}, {p.pair_second, "h2"}};
      const std::string last =
          emit_elementwise_chain(*graph, p.pair_nodes, name_of, "_e", i2, "kernel '" + name + "'", s);
      s << i2 << "out[m * kHalf + col] = " << codegen::store_expr(out_dtype, last) << ";\n";
    }
    s << in << "}\n";
  }

  void zero_acc(std::ostringstream& s, const std::string& in) const {
    s << in << "#pragma unroll\n" << in << "for (int m = 0; m < kM; ++m) acc[m] = 0.0f;\n";
    if (pair) s << in << "#pragma unroll\n" << in << "for (int m = 0; m < kM; ++m) acc2[m] = 0.0f;\n";
  }
};

// One column a warp: the warp issues its row's loads a group at a time
// (kG vectors a lane), sums them, reduces over the lanes and stores.
GemvKernel one_column_gemv(const GemvText& t, int64_t vec, int64_t vecs, int64_t columns) {
  const GemmPlan& p = t.p;
  const bool pair = t.pair;
  // Loads a lane issues before using any: a row's whole chunk when it is
  // short, kGemvGroup at most (registers).
  const int64_t group = std::min<int64_t>(kGemvGroup, (vecs + 31) / 32);
  std::ostringstream s;
  s << "// " << t.name << ": gemv m=" << p.m << " n=" << p.n << " k=" << p.k << "\n";
  t.signature(s, kGemvWarps);
  s << "  constexpr int kM = " << p.m << ", kG = " << group << ", kV = " << vec << ";\n"
    << "  constexpr long long kN = " << ll(p.n) << ", kK = " << ll(p.k) << ", kVecs = " << ll(vecs) << ";\n"
    << "  const int lane = threadIdx.x & 31;\n"
    << "  const long long col = (long long)blockIdx.x * " << kGemvWarps << " + (threadIdx.x >> 5);\n";
  if (pair)
    s << "  constexpr long long kHalf = " << ll(p.n / 2) << ";\n"
      << "  if (col >= kHalf) return;\n"
      << "  const uint4* wr2 = reinterpret_cast<const uint4*>(w + (col + kHalf) * kK);\n";
  else
    s << "  if (col >= kN) return;\n";
  s << "  const uint4* wr = reinterpret_cast<const uint4*>(w + col * kK);\n"
    << "  uint4 wv[kG];\n"
    << (pair ? "  uint4 wv2[kG];\n" : "");
  // The loads of the group at `base`.
  const std::string load = std::string(
                               "#pragma unroll\n"
                               "for (int g = 0; g < kG; ++g) {\n"
                               "  const long long v = base + 32 * g;\n"
                               "  if (v < kVecs) wv[g] = __ldg(wr + v); else wv[g] = make_uint4(0u, 0u, 0u, 0u);\n") +
                           (pair ? "  if (v < kVecs) wv2[g] = __ldg(wr2 + v); else wv2[g] = make_uint4(0u, 0u, 0u, 0u);\n"
                                 : "") +
                           "}\n";
  if (p.early_weights) emit_early_loads(s, load);
  t.norm_prologue(s);
  s << "  float acc[kM];\n" << (pair ? "  float acc2[kM];\n" : "");
  t.zero_acc(s, "  ");
  s << "  for (long long base = lane; base < kVecs; base += 32 * kG) {\n";
  if (p.early_weights) s << "    if (base != lane) {\n" << indented(load, "      ") << "    }\n";
  else s << indented(load, "    ");
  t.sum_group(s, "    ");
  s << "  }\n";
  t.reduce(s, "  ");
  s << "  if (lane != 0) return;\n";
  t.store(s, "  ");
  s << "}\n";
  GemvKernel k;
  k.source = s.str();
  k.grid = static_cast<uint32_t>((columns + kGemvWarps - 1) / kGemvWarps);
  k.block = 32 * kGemvWarps;
  return k;
}

// Strided (OpOptions::GemvStriding): at most max_blocks blocks; warp gw of
// the grid owns columns gw, gw + kTW, ... (kTW warps in all). Its work is a
// list of chunks (kG vectors a lane of one column's row, two rows when
// paired; kCPR chunks a row), and chunk j + 1's loads are issued before chunk
// j is summed, so the warp's loads stay in flight across its columns; the
// grid has no partial last wave, and the norm prologue is computed once a
// warp rather than once a column.
GemvKernel strided_gemv(const GemvText& t, int64_t vec, int64_t vecs, int64_t columns) {
  const GemmPlan& p = t.p;
  const bool pair = t.pair;
  const int warps = p.striding.warps;
  if (warps < 1 || warps > 32 || p.striding.max_blocks < 1)
    throw CompileError("internal: gemv striding of " + std::to_string(warps) + " warps, " +
                       std::to_string(p.striding.max_blocks) + " blocks");
  const int64_t group = std::min<int64_t>(pair ? kGemvGroup / 2 : kGemvGroup, (vecs + 31) / 32);
  const int64_t chunks_per_row = (vecs + 32 * group - 1) / (32 * group);
  const int64_t blocks = std::min<int64_t>((columns + warps - 1) / warps, p.striding.max_blocks);
  const int64_t total_warps = blocks * warps;
  std::ostringstream s;
  s << "// " << t.name << ": gemv m=" << p.m << " n=" << p.n << " k=" << p.k << ", columns strided over "
    << total_warps << " warps\n";
  t.signature(s, warps);
  s << "  constexpr int kM = " << p.m << ", kG = " << group << ", kV = " << vec << ";\n"
    << "  constexpr long long kN = " << ll(p.n) << ", kK = " << ll(p.k) << ", kVecs = " << ll(vecs)
    << ", kCols = " << ll(columns) << ", kTW = " << ll(total_warps) << ", kCPR = " << ll(chunks_per_row) << ";\n"
    << (pair ? "  constexpr long long kHalf = " + ll(p.n / 2) + ";\n" : std::string())
    << "  const int lane = threadIdx.x & 31;\n"
    << "  const long long gw = (long long)blockIdx.x * " << warps << " + (threadIdx.x >> 5);\n"
    << "  const long long chunks = gw < kCols ? ((kCols - 1 - gw) / kTW + 1) * kCPR : 0;\n"
    << "  const uint4* w4 = reinterpret_cast<const uint4*>(w);\n"
    << "  uint4 wv[kG], nv[kG];\n"
    << (pair ? "  uint4 wv2[kG], nv2[kG];\n" : "");
  // The loads of chunk `j` into `d` (and `d2`, the pair's second row).
  auto load = [&](const std::string& j, const std::string& d, const std::string& d2) {
    return "{\n"
           "  const long long lc = gw + (" + j + " / kCPR) * kTW, lb = (" + j + " % kCPR) * 32 * kG + lane;\n"
           "  const uint4* r = w4 + lc * kVecs;\n" +
           (pair ? "  const uint4* r2 = w4 + (lc + kHalf) * kVecs;\n" : std::string()) +
           "  #pragma unroll\n"
           "  for (int g = 0; g < kG; ++g) {\n"
           "    const long long v = lb + 32 * g;\n"
           "    " + d + "[g] = v < kVecs ? __ldg(r + v) : make_uint4(0u, 0u, 0u, 0u);\n" +
           (pair ? "    " + d2 + "[g] = v < kVecs ? __ldg(r2 + v) : make_uint4(0u, 0u, 0u, 0u);\n" : std::string()) +
           "  }\n"
           "}\n";
  };
  if (p.early_weights)
    s << "  // The weights are constants: the first chunk's loads are issued before this kernel waits for its\n"
      << "  // predecessor (with programmatic launch on sm_90+; a comment elsewhere).\n";
  s << "  if (chunks > 0)\n" << indented(load("0LL", "wv", "wv2"), "    ");
  if (p.early_weights) s << "  " << codegen::grid_dependency_wait() << "\n";
  s << "  if (chunks == 0) return;\n";
  t.norm_prologue(s);
  s << "  float acc[kM];\n" << (pair ? "  float acc2[kM];\n" : "");
  t.zero_acc(s, "  ");
  s << "  for (long long j = 0; j < chunks; ++j) {\n"
    << "    if (j + 1 < chunks)\n"
    << indented(load("(j + 1)", "nv", "nv2"), "      ")
    << "    const long long base = (j % kCPR) * 32 * kG + lane;\n";
  t.sum_group(s, "    ");
  s << "    if (j % kCPR == kCPR - 1) {  // the column's last chunk: sum over the lanes and store\n"
    << "      const long long col = gw + (j / kCPR) * kTW;\n";
  t.reduce(s, "      ");
  s << "      if (lane == 0) {\n";
  t.store(s, "        ");
  s << "      }\n";
  t.zero_acc(s, "      ");
  s << "    }\n"
    << "    #pragma unroll\n"
    << "    for (int g = 0; g < kG; ++g) wv[g] = nv[g];\n"
    << (pair ? "    #pragma unroll\n    for (int g = 0; g < kG; ++g) wv2[g] = nv2[g];\n" : "")
    << "  }\n"
    << "}\n";
  GemvKernel k;
  k.source = s.str();
  k.grid = static_cast<uint32_t>(blocks);
  k.block = static_cast<uint32_t>(32 * warps);
  return k;
}

}  // namespace

GemvKernel generate_gemv_kernel(const GemmPlan& p, engine::DType dtype, const std::string& name,
                                engine::DType norm_weight_dtype, const ir::Graph* graph) {
  const bool pair = p.paired;
  if (pair && graph == nullptr) throw CompileError("internal: a paired gemv kernel needs its graph");
  // Paired: a warp owns column `col` of both halves (rows col and col + kHalf
  // of w), the second one's terms in acc2, and stores the elementwise
  // epilogue of the two into out[m, kHalf].
  const engine::DType out_dtype = pair ? graph->value(p.out).dtype : dtype;
  const int64_t vec = 16 / static_cast<int64_t>(engine::dtype_size(dtype));
  const int64_t vecs = p.k / vec;  // 16-byte vectors in one weight row
  if (wide_shape(p, vecs)) return generate_wide_gemv(p, dtype, name, vec, vecs);
  const GemvText text{p,    dtype,        out_dtype,  norm_weight_dtype, graph, name, codegen::storage_type(dtype),
                      pair, p.rms_norm,   p.rms_norm && p.norm_weight >= 0};
  const int64_t columns = pair ? p.n / 2 : p.n;
  // A product whose one-column grid would take more than min_blocks blocks
  // is strided; below, the strided loop's own cost (a chunk's address
  // arithmetic, twice the registers) outweighs it (docs/design_llm.md).
  if ((columns + kGemvWarps - 1) / kGemvWarps > p.striding.min_blocks)
    return strided_gemv(text, vec, vecs, columns);
  return one_column_gemv(text, vec, vecs, columns);
}

}  // namespace kiln::ops
