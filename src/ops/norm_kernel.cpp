#include "ops/norm_kernel.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "codegen/cuda_dtype.h"

namespace kiln::ops {
using codegen::load_expr;
using codegen::storage_type;
using codegen::store_expr;
namespace {

// Offset of flat index `var` over the row-major `shape` where each dim
// moves `coef` elements; dims of size 1 or coefficient 0 add nothing, and
// the outermost needs no modulo (the caller keeps `var` below the numel).
std::string flat_offset(const std::string& var, const std::vector<int64_t>& shape, const std::vector<int64_t>& coef) {
  std::ostringstream expr;
  bool first = true;
  int64_t step = 1;
  for (size_t j = shape.size(); j-- > 0;) {
    if (shape[j] != 1 && coef[j] != 0) {
      if (!first) expr << " + ";
      first = false;
      expr << "(";
      if (step != 1) expr << "(" << var << " / " << step << "LL)";
      else expr << var;
      if (j != 0) expr << " % " << shape[j] << "LL";
      expr << ")";
      if (coef[j] != 1) expr << " * " << coef[j] << "LL";
    }
    step *= shape[j];
  }
  return first ? "0LL" : expr.str();
}

std::string float_literal(double v) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.9ef", static_cast<double>(static_cast<float>(v)));
  return buffer;
}

std::vector<int64_t> slice(const std::vector<int64_t>& v, size_t from, size_t to) {
  return std::vector<int64_t>(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to));
}

// Sums `var` over the row's threads; every thread ends with the same value
// (butterfly shuffles add in the same pairs; the warps' partials are added
// in warp order by every thread).
void emit_row_sum(std::ostream& s, const std::string& var, int64_t tpr) {
  s << "  for (int s = 16; s > 0; s >>= 1) " << var << " += __shfl_xor_sync(0xffffffffu, " << var << ", s);\n";
  if (tpr <= 32) return;
  s << "  if ((t & 31) == 0) kiln_part[t >> 5] = " << var << ";\n"
    << "  __syncthreads();\n"
    << "  " << var << " = kiln_part[0];\n"
    << "  #pragma unroll\n"
    << "  for (int w = 1; w < " << tpr / 32 << "; ++w) " << var << " += kiln_part[w];\n"
    << "  __syncthreads();\n";
}

// Chan's combination of two Welford states (count, mean, M2), written so
// that combining a with b and b with a give the same bits.
const char* kCombine =
    "#define KILN_WELFORD_COMBINE(na, ma, qa, nb, mb, qb) { \\\n"
    "    const float n_ = (na) + (nb); \\\n"
    "    if (n_ > 0.0f) { \\\n"
    "      const float d_ = (mb) - (ma); \\\n"
    "      const float w_ = (na) * (nb) / n_; \\\n"
    "      ma = ((na) * (ma) + (nb) * (mb)) / n_; \\\n"
    "      qa = ((qa) + (qb)) + d_ * d_ * w_; \\\n"
    "      na = n_; \\\n"
    "    } }\n";

}  // namespace

NormLaunch norm_launch(int64_t rows, int64_t row_size) {
  NormLaunch l;
  const int64_t size = std::max<int64_t>(row_size, 1);
  while (l.threads_per_row < kNormMaxThreadsPerRow &&
         (size + l.threads_per_row - 1) / l.threads_per_row > kNormTargetPerThread)
    l.threads_per_row *= 2;
  l.per_thread = (size + l.threads_per_row - 1) / l.threads_per_row;
  l.cached = l.per_thread <= kNormMaxCachedPerThread;
  l.rows_per_block = l.threads_per_row == 32 ? std::min(kNormWarpRowsPerBlock, std::max<int64_t>(rows, 1)) : 1;
  const int64_t blocks = std::max<int64_t>((rows + l.rows_per_block - 1) / l.rows_per_block, 1);
  if (blocks > 0x7fffffff) throw CompileError("normalization has too many rows (" + std::to_string(rows) + ")");
  l.grid = static_cast<uint32_t>(blocks);
  l.block = static_cast<uint32_t>(l.threads_per_row * l.rows_per_block);
  return l;
}

NormKernel generate_norm_kernel(const ir::Graph& graph, const NormPlan& plan, const std::string& name) {
  const ir::Value& in = graph.value(plan.input);
  const ir::Value& out = graph.value(plan.out);
  const size_t nr = plan.row_shape.size(), ne = plan.elem_shape.size();
  if (plan.data_coef.size() != nr + ne || plan.param_coef.size() != nr + ne)
    throw CompileError("internal: normalization '" + out.name + "' has coefficients for " +
                       std::to_string(plan.data_coef.size()) + " dims, expected " + std::to_string(nr + ne));
  const int64_t rows = plan.rows(), L = plan.row_size();
  if (L < 1) throw CompileError("normalization '" + out.name + "' has empty rows");
  NormKernel kernel;
  const NormLaunch l = kernel.launch = norm_launch(rows, L);
  const int64_t tpr = l.threads_per_row;
  const bool affine = plan.weight >= 0 || plan.bias >= 0;

  const std::string row_off = flat_offset("row", plan.row_shape, slice(plan.data_coef, 0, nr));
  const std::string elem_off = flat_offset("e", plan.elem_shape, slice(plan.data_coef, nr, nr + ne));
  const std::string prow_off = flat_offset("row", plan.row_shape, slice(plan.param_coef, 0, nr));
  const std::string pelem_off = flat_offset("e", plan.elem_shape, slice(plan.param_coef, nr, nr + ne));
  const std::string Lf = std::to_string(L) + ".0f";
  // y = (x - mean) * rstd, then the affine parameters of element e.
  auto normalized = [&](const std::string& x) {
    std::string y = "(" + x + " - mean) * rstd";
    const std::string p = "pbase + " + pelem_off;
    if (plan.weight >= 0) y = "(" + y + ") * " + load_expr(graph.value(plan.weight).dtype, "weight[" + p + "]");
    if (plan.bias >= 0) y = y + " + " + load_expr(graph.value(plan.bias).dtype, "bias[" + p + "]");
    return y;
  };

  std::ostringstream s;
  if (!l.cached) s << "#ifndef KILN_WELFORD_COMBINE\n" << kCombine << "#endif\n";
  s << "extern \"C\" __global__ void __launch_bounds__(" << l.block << ") " << name << "(\n    "
    << storage_type(out.dtype) << "* __restrict__ out, const " << storage_type(in.dtype) << "* __restrict__ in";
  if (plan.weight >= 0) s << ", const " << storage_type(graph.value(plan.weight).dtype) << "* __restrict__ weight";
  if (plan.bias >= 0) s << ", const " << storage_type(graph.value(plan.bias).dtype) << "* __restrict__ bias";
  s << ", long long n) {\n";
  if (l.rows_per_block > 1)
    s << "  const long long row = (long long)blockIdx.x * " << l.rows_per_block << " + (threadIdx.x >> 5);\n"
      << "  const int t = threadIdx.x & 31;\n";
  else
    s << "  const long long row = blockIdx.x;\n"
      << "  const int t = threadIdx.x;\n";
  s << "  if (row >= n / " << L << "LL) return;  // a whole row's threads leave together\n"
    << "  const long long base = " << row_off << ";\n";
  if (affine) s << "  const long long pbase = " << prow_off << ";\n";
  if (tpr > 32) {
    s << "  __shared__ float kiln_part[" << tpr / 32 << "];\n";
    if (!l.cached) s << "  __shared__ float kiln_part_mean[" << tpr / 32 << "], kiln_part_m2[" << tpr / 32 << "];\n";
  }

  if (l.cached) {
    const int64_t K = l.per_thread;
    const bool ragged = K * tpr != L;
    const std::string guard = ragged ? "if (e < " + std::to_string(L) + ") " : "";
    s << "  float v[" << K << "];\n"
      << "  float sum = 0.0f;\n"
      << "  #pragma unroll\n"
      << "  for (int k = 0; k < " << K << "; ++k) {\n"
      << "    const int e = t + k * " << tpr << ";\n"
      << "    v[k] = 0.0f;\n"
      << "    " << guard << "{ v[k] = " << load_expr(in.dtype, "in[base + " + elem_off + "]") << "; sum += v[k]; }\n"
      << "  }\n";
    emit_row_sum(s, "sum", tpr);
    s << "  const float mean = sum / " << Lf << ";\n"
      << "  float sq = 0.0f;\n"
      << "  #pragma unroll\n"
      << "  for (int k = 0; k < " << K << "; ++k) {\n"
      << "    const int e = t + k * " << tpr << ";\n"
      << "    " << guard << "{ const float d = v[k] - mean; sq += d * d; }\n"
      << "  }\n";
    emit_row_sum(s, "sq", tpr);
    s << "  const float rstd = rsqrtf(sq / " << Lf << " + " << float_literal(plan.eps) << ");\n"
      << "  #pragma unroll\n"
      << "  for (int k = 0; k < " << K << "; ++k) {\n"
      << "    const int e = t + k * " << tpr << ";\n"
      << "    " << guard << "out[base + " << elem_off << "] = " << store_expr(out.dtype, normalized("v[k]")) << ";\n"
      << "  }\n"
      << "}\n";
  } else {
    s << "  float cnt = 0.0f, mean = 0.0f, m2 = 0.0f;\n"
      << "  for (long long e = t; e < " << L << "LL; e += " << tpr << ") {\n"
      << "    const float x = " << load_expr(in.dtype, "in[base + " + elem_off + "]") << ";\n"
      << "    cnt += 1.0f;\n"
      << "    const float d = x - mean;\n"
      << "    mean += d / cnt;\n"
      << "    m2 += d * (x - mean);\n"
      << "  }\n"
      << "  for (int s = 16; s > 0; s >>= 1) {\n"
      << "    const float nb = __shfl_xor_sync(0xffffffffu, cnt, s);\n"
      << "    const float mb = __shfl_xor_sync(0xffffffffu, mean, s);\n"
      << "    const float qb = __shfl_xor_sync(0xffffffffu, m2, s);\n"
      << "    KILN_WELFORD_COMBINE(cnt, mean, m2, nb, mb, qb);\n"
      << "  }\n";
    if (tpr > 32)
      s << "  if ((t & 31) == 0) { kiln_part[t >> 5] = cnt; kiln_part_mean[t >> 5] = mean; kiln_part_m2[t >> 5] = m2; }\n"
        << "  __syncthreads();\n"
        << "  cnt = kiln_part[0]; mean = kiln_part_mean[0]; m2 = kiln_part_m2[0];\n"
        << "  for (int w = 1; w < " << tpr / 32 << "; ++w)\n"
        << "    KILN_WELFORD_COMBINE(cnt, mean, m2, kiln_part[w], kiln_part_mean[w], kiln_part_m2[w]);\n";
    s << "  const float rstd = rsqrtf(m2 / " << Lf << " + " << float_literal(plan.eps) << ");\n"
      << "  for (long long e = t; e < " << L << "LL; e += " << tpr << ") {\n"
      << "    const float x = " << load_expr(in.dtype, "in[base + " + elem_off + "]") << ";\n"
      << "    out[base + " << elem_off << "] = " << store_expr(out.dtype, normalized("x")) << ";\n"
      << "  }\n"
      << "}\n";
  }
  kernel.source = s.str();
  return kernel;
}

}  // namespace kiln::ops
