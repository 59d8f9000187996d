#include "ops/gemv_kernel.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "codegen/cuda_dtype.h"
#include "codegen/grid_dependency.h"
#include "ops/elementwise_kernel.h"
#include "ops/grid_loop.h"
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

GemvKernel generate_gemv_kernel(const GemmPlan& p, engine::DType dtype, const std::string& name,
                                engine::DType norm_weight_dtype, const ir::Graph* graph,
                                const std::vector<GridLoop>* loops) {
  const bool pair = p.paired;
  if (pair && graph == nullptr) throw CompileError("internal: a paired gemv kernel needs its graph");
  // Loop members (GemmPlan::loop_members): a warp owns columns col and
  // col + kHalf of a block of 2 * kHalf columns, stores both, then runs the
  // members' iterations that read them.
  const bool scatter = loops != nullptr && !loops->empty();
  if (scatter && (pair || p.m != 1 || p.loop_half < 1 || p.n % (2 * p.loop_half) != 0 ||
                  loops->size() != p.loop_offsets.size()))
    throw CompileError("internal: a gemv kernel with loop members needs one row, no pair epilogue and whole column "
                       "blocks");
  const bool two = pair || scatter;  // two weight rows a warp
  // Paired: a warp owns column `col` of both halves (rows col and col + kHalf
  // of w), the second one's terms in acc2, and stores the elementwise
  // epilogue of the two into out[m, kHalf].
  const engine::DType out_dtype = pair ? graph->value(p.out).dtype : dtype;
  const int64_t vec = 16 / static_cast<int64_t>(engine::dtype_size(dtype));
  const int64_t vecs = p.k / vec;  // 16-byte vectors in one weight row
  if (!scatter && wide_shape(p, vecs)) return generate_wide_gemv(p, dtype, name, vec, vecs);
  // Loads a lane issues before using any: a row's whole chunk when it is
  // short, kGemvGroup at most (registers).
  const int64_t group = std::min<int64_t>(kGemvGroup, (vecs + 31) / 32);
  const bool has_bias = p.bias >= 0, has_c = p.c >= 0;
  const std::string T = codegen::storage_type(dtype);
  std::ostringstream s;
  s << "// " << name << ": gemv m=" << p.m << " n=" << p.n << " k=" << p.k << "\n"
    << "extern \"C\" __global__ void __launch_bounds__(" << 32 * kGemvWarps << ") " << name << "(\n"
    // With loop members `out` is read back through their pointers: no __restrict__ on either.
    << "    " << codegen::storage_type(out_dtype) << (scatter ? "* out" : "* __restrict__ out") << ", const " << T
    << "* __restrict__ x, const " << T << "* __restrict__ w";
  if (has_bias) s << ", const " << T << "* __restrict__ bias";
  if (has_c) s << ", const " << T << "* __restrict__ c";
  const bool norm = p.rms_norm, norm_weight = p.rms_norm && p.norm_weight >= 0;
  if (norm_weight) s << ", const " << codegen::storage_type(norm_weight_dtype) << "* __restrict__ nw";
  // Member j's parameters (m<j>_<name>, without __restrict__: they read back `out`); its scope
  // binds them back to the names its body uses.
  if (scatter)
    for (size_t j = 0; j < loops->size(); ++j)
      for (const std::string& decl : grid_loop_member_params((*loops)[j], j, false)) s << ",\n    " << decl;
  s << ") {\n"
    << "  constexpr int kM = " << p.m << ", kG = " << group << ", kV = " << vec << ";\n"
    << "  constexpr long long kN = " << ll(p.n) << ", kK = " << ll(p.k) << ", kVecs = " << ll(vecs) << ";\n"
    << "  const int lane = threadIdx.x & 31;\n";
  if (two)
    s << "  constexpr long long kHalf = " << ll(pair ? p.n / 2 : p.loop_half) << ";\n"
      << "  const long long wi = (long long)blockIdx.x * " << kGemvWarps << " + (threadIdx.x >> 5);\n"
      << "  if (wi >= kN / 2) return;\n"
      << "  const long long col = (wi / kHalf) * (2 * kHalf) + wi % kHalf;\n"
      << "  const uint4* wr2 = reinterpret_cast<const uint4*>(w + (col + kHalf) * kK);\n";
  else
    s << "  const long long col = (long long)blockIdx.x * " << kGemvWarps << " + (threadIdx.x >> 5);\n"
      << "  if (col >= kN) return;\n";
  s << "  const uint4* wr = reinterpret_cast<const uint4*>(w + col * kK);\n"
    << "  uint4 wv[kG];\n"
    << (two ? "  uint4 wv2[kG];\n" : "");
  // The loads of the group at `base`.
  const std::string load = std::string(
                               "#pragma unroll\n"
                               "for (int g = 0; g < kG; ++g) {\n"
                               "  const long long v = base + 32 * g;\n"
                               "  if (v < kVecs) wv[g] = __ldg(wr + v); else wv[g] = make_uint4(0u, 0u, 0u, 0u);\n") +
                           (two ? "  if (v < kVecs) wv2[g] = __ldg(wr2 + v); else wv2[g] = make_uint4(0u, 0u, 0u, 0u);\n"
                                 : "") +
                           "}\n";
  if (p.early_weights) emit_early_loads(s, load);
  if (norm) {
    // RMSNorm prologue: each warp computes its rows' rsqrt(mean(x^2) + eps)
    // (a row is a few KiB, read from cache by every warp); the products then
    // take x * weight and the sum is scaled once by the row's factor.
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
  const std::string x_term = norm_weight ? codegen::load_expr(dtype, "xe[e]") + " * " +
                                               codegen::load_expr(norm_weight_dtype, "nw[v * kV + e]")
                                         : codegen::load_expr(dtype, "xe[e]");
  s << "  float acc[kM];\n"
    << (two ? "  float acc2[kM];\n" : "")
    << "  #pragma unroll\n"
    << "  for (int m = 0; m < kM; ++m) acc[m] = 0.0f;\n"
    << (two ? "  #pragma unroll\n  for (int m = 0; m < kM; ++m) acc2[m] = 0.0f;\n" : "")
    << "  for (long long base = lane; base < kVecs; base += 32 * kG) {\n";
  if (p.early_weights) s << "    if (base != lane) {\n" << indented(load, "      ") << "    }\n";
  else s << indented(load, "    ");
  s << "    #pragma unroll\n"
    << "    for (int g = 0; g < kG; ++g) {\n"
    << "      const long long v = base + 32 * g;\n"
    << "      if (v >= kVecs) break;\n"
    << "      const " << T << "* we = reinterpret_cast<const " << T << "*>(&wv[g]);\n"
    << (two ? "      const " + T + "* we2 = reinterpret_cast<const " + T + "*>(&wv2[g]);\n" : std::string())
    << "      #pragma unroll\n"
    << "      for (int m = 0; m < kM; ++m) {\n"
    << "        const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + m * kK) + v);\n"
    << "        const " << T << "* xe = reinterpret_cast<const " << T << "*>(&xv);\n"
    << "        #pragma unroll\n";
  if (two)
    s << "        for (int e = 0; e < kV; ++e) {\n"
      << "          const float xf = " << x_term << ";\n"
      << "          acc[m] = fmaf(" << codegen::load_expr(dtype, "we[e]") << ", xf, acc[m]);\n"
      << "          acc2[m] = fmaf(" << codegen::load_expr(dtype, "we2[e]") << ", xf, acc2[m]);\n"
      << "        }\n";
  else
    s << "        for (int e = 0; e < kV; ++e) acc[m] = fmaf(" << codegen::load_expr(dtype, "we[e]") << ", " << x_term
      << ", acc[m]);\n";
  s << "      }\n"
    << "    }\n"
    << "  }\n";
  // With loop members (and a placed wait): the successor (a decode step's attention) launches
  // only once the products are done, so its blocks do not compete with them.
  if (scatter && p.early_weights) s << "  " << codegen::grid_dependency_trigger() << "\n";
  s << "  #pragma unroll\n"
    << "  for (int m = 0; m < kM; ++m) {\n"
    << "    float a = acc[m];\n"
    << "    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);\n"
    << "    acc[m] = a;\n"
    << (two ? "    float a2 = acc2[m];\n"
               "    for (int o = 16; o > 0; o >>= 1) a2 += __shfl_xor_sync(0xffffffffu, a2, o);\n"
               "    acc2[m] = a2;\n"
             : "")
    << "  }\n"
    << "  if (lane != 0) return;\n"
    << "  #pragma unroll\n"
    << "  for (int m = 0; m < kM; ++m) {\n"
    << "    float r = acc[m]" << (norm ? " * rs[m]" : "") << ";\n";
  if (two) {
    // The warp's second column too, each with its bias.
    s << "    float r2 = acc2[m]" << (norm ? " * rs[m]" : "") << ";\n";
    if (has_bias)
      s << "    r += " << codegen::load_expr(dtype, "bias[col]") << ";\n"
        << "    r2 += " << codegen::load_expr(dtype, "bias[col + kHalf]") << ";\n";
  }
  if (scatter) {
    // Both columns stored, then (below) the members' iterations that read them, in this lane:
    // its own stores are what it reads back.
    s << "    out[m * kN + col] = " << codegen::store_expr(dtype, "r") << ";\n"
      << "    out[m * kN + col + kHalf] = " << codegen::store_expr(dtype, "r2") << ";\n";
  } else if (!pair) {
    emit_plain_store(s, p, dtype, "    ");
  } else {
    // The two halves as the product's dtype stores them (what the separate
    // elementwise kernel read), then its arithmetic.
    s << "    const " << T << " q1 = " << codegen::store_expr(dtype, "r") << ";\n"
      << "    const " << T << " q2 = " << codegen::store_expr(dtype, "r2") << ";\n"
      << "    const float h1 = " << codegen::load_expr(dtype, "q1") << ", h2 = " << codegen::load_expr(dtype, "q2")
      << ";\n";
    std::map<int, std::string> name_of{{p.pair_first, "h1"}, {p.pair_second, "h2"}};
    const std::string last =
        emit_elementwise_chain(*graph, p.pair_nodes, name_of, "_e", "    ", "kernel '" + name + "'", s);
    s << "    out[m * kHalf + col] = " << codegen::store_expr(out_dtype, last) << ";\n";
  }
  s << "  }\n";
  if (scatter)
    for (size_t j = 0; j < loops->size(); ++j) {
      const GridLoop& loop = (*loops)[j];
      const int64_t off = p.loop_offsets[j];
      s << "  if (col >= " << ll(off) << " && col < " << ll(off + loop.count) << ") {  // member " << j << "\n";
      s << grid_loop_member_bindings(loop, j, "    ", false);
      for (const char* column : {"col", "col + kHalf"})
        s << "    {\n      const long long i = " << column << " - " << ll(off) << ";\n" << loop.body << "    }\n";
      s << "  }\n";
    }
  s << "}\n";
  GemvKernel k;
  k.source = s.str();
  const int64_t columns = two ? p.n / 2 : p.n;
  k.grid = static_cast<uint32_t>((columns + kGemvWarps - 1) / kGemvWarps);
  k.block = 32 * kGemvWarps;
  return k;
}

}  // namespace kiln::ops
