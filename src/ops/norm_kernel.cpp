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


std::vector<int64_t> slice(const std::vector<int64_t>& v, size_t from, size_t to) {
  return std::vector<int64_t>(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to));
}

// Combines the threads' (cnt, mean, m2) over the row's threads: butterfly
// shuffles within a warp, then (a block a row) every thread folds the
// warps' partials in warp order, so every thread ends with the same bits.
void emit_row_combine(std::ostream& s, int64_t tpr) {
  s << "  for (int s = 16; s > 0; s >>= 1) {\n"
    << "    const float nb = __shfl_xor_sync(0xffffffffu, cnt, s);\n"
    << "    const float mb = __shfl_xor_sync(0xffffffffu, mean, s);\n"
    << "    const float qb = __shfl_xor_sync(0xffffffffu, m2, s);\n"
    << "    KILN_WELFORD_COMBINE(cnt, mean, m2, nb, mb, qb);\n"
    << "  }\n";
  if (tpr <= 32) return;
  s << "  if ((t & 31) == 0) { kiln_part_n[t >> 5] = cnt; kiln_part_mean[t >> 5] = mean; kiln_part_m2[t >> 5] = m2; }\n"
    << "  __syncthreads();\n"
    << "  cnt = kiln_part_n[0]; mean = kiln_part_mean[0]; m2 = kiln_part_m2[0];\n"
    << "  for (int w = 1; w < " << tpr / 32 << "; ++w)\n"
    << "    KILN_WELFORD_COMBINE(cnt, mean, m2, kiln_part_n[w], kiln_part_mean[w], kiln_part_m2[w]);\n";
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

NormLaunch norm_launch(int64_t rows, int64_t row_size, int64_t threads_per_row, int64_t vector) {
  NormLaunch l;
  if (vector < 1 || row_size % vector != 0) vector = 1;
  l.vector = vector;
  const int64_t size = std::max<int64_t>(row_size, 1);
  if (threads_per_row != 0) {
    if (threads_per_row < 32 || threads_per_row > kNormMaxThreadsPerRow || (threads_per_row & (threads_per_row - 1)))
      throw CompileError("internal: threads per row must be a power of two in 32..1024");
    l.threads_per_row = threads_per_row;
  }
  // In vectors of `vector` elements: each thread takes whole vectors.
  const int64_t units = (size + vector - 1) / vector, target = std::max<int64_t>(kNormTargetPerThread / vector, 1);
  while (threads_per_row == 0 && l.threads_per_row < kNormMaxThreadsPerRow &&
         (units + l.threads_per_row - 1) / l.threads_per_row > target)
    l.threads_per_row *= 2;
  l.per_thread = (units + l.threads_per_row - 1) / l.threads_per_row * vector;
  l.cached = l.per_thread <= kNormMaxCachedPerThread;
  if (!l.cached) l.vector = 1;  // streaming reads scalars
  l.rows_per_block = l.threads_per_row == 32 ? std::min(kNormWarpRowsPerBlock, std::max<int64_t>(rows, 1)) : 1;
  const int64_t blocks = std::max<int64_t>((rows + l.rows_per_block - 1) / l.rows_per_block, 1);
  if (blocks > 0x7fffffff) throw CompileError("normalization has too many rows (" + std::to_string(rows) + ")");
  l.grid = static_cast<uint32_t>(blocks);
  l.block = static_cast<uint32_t>(l.threads_per_row * l.rows_per_block);
  return l;
}

int64_t norm_vector_width(const ir::Graph& graph, const NormPlan& plan) {
  const size_t nr = plan.row_shape.size(), ne = plan.elem_shape.size();
  if (ne == 0 || plan.data_coef.size() != nr + ne) return 1;
  const size_t widest = std::max(engine::dtype_size(graph.value(plan.input).dtype),
                                 engine::dtype_size(graph.value(plan.out).dtype));
  const bool strided = !plan.input_coef.empty();
  if (strided && plan.input_coef.size() != nr + ne) return 1;
  for (int64_t v = static_cast<int64_t>(16 / widest); v > 1; v /= 2) {
    bool ok = plan.data_coef.back() == 1 && plan.elem_shape.back() % v == 0;
    for (size_t d = 0; d + 1 < nr + ne; ++d) ok &= plan.data_coef[d] % v == 0;
    if (strided) {
      ok &= plan.input_coef.back() == 1 && plan.input_base % v == 0;
      for (size_t d = 0; d + 1 < nr + ne; ++d) ok &= plan.input_coef[d] % v == 0;
    }
    if (ok) return v;
  }
  return 1;
}

namespace {

// Raw vector types of `lanes` elements of `d` (8 or 16 bytes) and the
// expressions that unpack lane i of `var` to float, or pack floats.
std::string raw_vector_type(engine::DType d, int64_t lanes) {
  const int64_t bytes = lanes * static_cast<int64_t>(engine::dtype_size(d));
  if (bytes == 16) return "uint4";
  if (bytes == 8) return "uint2";
  if (bytes == 4) return "unsigned int";
  throw CompileError("internal: no vector of " + std::to_string(bytes) + " bytes");
}
std::string word(const std::string& var, engine::DType d, int64_t lanes, int64_t i, int64_t& shift) {
  const int64_t per_word = 4 / static_cast<int64_t>(engine::dtype_size(d));
  const int64_t w = i / per_word;
  shift = (i % per_word) * 32 / per_word;
  if (lanes * static_cast<int64_t>(engine::dtype_size(d)) == 4) return var;
  static const char* kField[] = {".x", ".y", ".z", ".w"};
  return var + kField[w];
}
std::string unpack(const std::string& var, engine::DType d, int64_t lanes, int64_t i) {
  int64_t shift = 0;
  const std::string w = word(var, d, lanes, i, shift);
  if (d == engine::DType::kFloat32) return "__uint_as_float(" + w + ")";
  return load_expr(d, "(unsigned short)((" + w + " >> " + std::to_string(shift) + ") & 0xffffu)");
}

}  // namespace

NormKernel generate_norm_kernel(const ir::Graph& graph, const NormPlan& plan, const std::string& name,
                                int64_t threads_per_row, int64_t vector, bool rms) {
  const ir::Value& in = graph.value(plan.input);
  const ir::Value& out = graph.value(plan.out);
  const size_t nr = plan.row_shape.size(), ne = plan.elem_shape.size();
  if (plan.data_coef.size() != nr + ne || plan.param_coef.size() != nr + ne)
    throw CompileError("internal: normalization '" + out.name + "' has coefficients for " +
                       std::to_string(plan.data_coef.size()) + " dims, expected " + std::to_string(nr + ne));
  const int64_t rows = plan.rows(), L = plan.row_size();
  if (L < 1) throw CompileError("normalization '" + out.name + "' has empty rows");
  const int64_t widest = norm_vector_width(graph, plan);
  if (vector == 0 || vector > widest) vector = widest;
  NormKernel kernel;
  const NormLaunch l = kernel.launch = norm_launch(rows, L, threads_per_row, vector);
  const int64_t tpr = l.threads_per_row;
  const bool affine = plan.weight >= 0 || plan.bias >= 0;
  const int64_t pinner = ne > 0 ? plan.param_coef.back() : 0;

  const std::string row_off = flat_offset("row", plan.row_shape, slice(plan.data_coef, 0, nr));
  const std::string elem_off = flat_offset("e", plan.elem_shape, slice(plan.data_coef, nr, nr + ne));
  // Where element e of the row is read: as written, or through the input's own coefficients.
  const bool strided = !plan.input_coef.empty();
  if (strided && plan.input_coef.size() != nr + ne)
    throw CompileError("internal: normalization '" + out.name + "' has input coefficients for " +
                       std::to_string(plan.input_coef.size()) + " dims, expected " + std::to_string(nr + ne));
  const std::string in_at =
      strided ? "ibase + " + flat_offset("e", plan.elem_shape, slice(plan.input_coef, nr, nr + ne)) : "base + " + elem_off;
  const std::string prow_off = flat_offset("row", plan.row_shape, slice(plan.param_coef, 0, nr));
  const std::string pelem_off = flat_offset("e", plan.elem_shape, slice(plan.param_coef, nr, nr + ne));
  const std::string Lf = std::to_string(L) + ".0f";
  const std::string eps = codegen::float_literal(plan.eps);
  // y = (x - mean) * rstd, then the affine parameters of element e + lane.
  auto normalized = [&](const std::string& x, int64_t lane) {
    std::string y = "(" + x + " - mean) * rstd";
    std::string p = "pbase + " + pelem_off;
    if (lane != 0 && pinner != 0) p += " + " + std::to_string(lane * pinner);
    if (plan.weight >= 0) y = "(" + y + ") * " + load_expr(graph.value(plan.weight).dtype, "weight[" + p + "]");
    if (plan.bias >= 0) y = y + " + " + load_expr(graph.value(plan.bias).dtype, "bias[" + p + "]");
    return y;
  };

  // The row held in registers, V elements a vector access: each thread's
  // count, mean and M2 over its values, one combination, normalize, store.
  auto cached_body = [&](int64_t V) {
    std::ostringstream b;
    const int64_t units = L / V, K = (units + tpr - 1) / tpr;
    const bool ragged = K * tpr != units;
    const std::string guard = ragged ? "if (j < " + std::to_string(units) + ") " : "";
    b << "    float v[" << K * V << "];\n"
      << "    float sum = 0.0f;\n"
      << "    #pragma unroll\n"
      << "    for (int k = 0; k < " << K << "; ++k) {\n"
      << "      const int j = t + k * " << tpr << ", e = j * " << V << ";\n";
    for (int64_t i = 0; i < V; ++i) b << "      v[k * " << V << " + " << i << "] = 0.0f;\n";
    b << "      " << guard << "{\n";
    if (V == 1) {
      b << "        v[k] = " << load_expr(in.dtype, "in[" + in_at + "]") << ";\n";
    } else {
      const std::string vt = raw_vector_type(in.dtype, V);
      b << "        const " << vt << " r = *reinterpret_cast<const " << vt << "*>(in + " << in_at << ");\n";
      for (int64_t i = 0; i < V; ++i) b << "        v[k * " << V << " + " << i << "] = " << unpack("r", in.dtype, V, i) << ";\n";
    }
    for (int64_t i = 0; i < V; ++i) b << "        sum += v[k * " << V << " + " << i << "];\n";
    b << "      }\n"
      << "    }\n";
    // Elements this thread holds: units t, t + tpr, ... below `units`.
    if (ragged)
      b << "    float cnt = (float)(((" << units << " - t + " << tpr - 1 << ") / " << tpr << ") * " << V << ");\n";
    else
      b << "    float cnt = " << K * V << ".0f;\n";
    // RMS: deviations from 0, so M2 is the sum of squares (and the
    // combination, with both means 0, adds them).
    b << (rms ? "    float mean = 0.0f;\n" : "    float mean = cnt > 0.0f ? sum / cnt : 0.0f;\n")
      << "    float m2 = 0.0f;\n"
      << "    #pragma unroll\n"
      << "    for (int k = 0; k < " << K << "; ++k) {\n"
      << "      const int j = t + k * " << tpr << ";\n"
      << "      " << guard << "{\n";
    for (int64_t i = 0; i < V; ++i)
      b << "        { const float d = v[k * " << V << " + " << i << "] - mean; m2 += d * d; }\n";
    b << "      }\n"
      << "    }\n";
    std::ostringstream c;
    emit_row_combine(c, tpr);
    b << c.str()
      << "    const float rstd = rsqrtf(m2 / " << Lf << " + " << eps << ");\n"
      << "    #pragma unroll\n"
      << "    for (int k = 0; k < " << K << "; ++k) {\n"
      << "      const int j = t + k * " << tpr << ", e = j * " << V << ";\n"
      << "      " << guard << "{\n";
    if (V == 1) {
      b << "        out[base + " << elem_off << "] = " << store_expr(out.dtype, normalized("v[k]", 0)) << ";\n";
    } else {
      const std::string vt = raw_vector_type(out.dtype, V);
      const int64_t per_word = 4 / static_cast<int64_t>(engine::dtype_size(out.dtype));
      std::vector<std::string> words(static_cast<size_t>((V + per_word - 1) / per_word));
      for (int64_t i = 0; i < V; ++i) {
        const std::string y = normalized("v[k * " + std::to_string(V) + " + " + std::to_string(i) + "]", i);
        std::string bits = out.dtype == engine::DType::kFloat32
                               ? "__float_as_uint(" + y + ")"
                               : "((unsigned int)" + store_expr(out.dtype, y) + " << " +
                                     std::to_string((i % per_word) * 32 / per_word) + ")";
        std::string& w = words[static_cast<size_t>(i / per_word)];
        w = w.empty() ? bits : w + " | " + bits;
      }
      b << "        " << vt << " r;\n";
      static const char* kField[] = {".x", ".y", ".z", ".w"};
      for (size_t w = 0; w < words.size(); ++w)
        b << "        r" << (words.size() == 1 ? "" : kField[w]) << " = " << words[w] << ";\n";
      b << "        *reinterpret_cast<" << vt << "*>(out + base + " << elem_off << ") = r;\n";
    }
    b << "      }\n"
      << "    }\n";
    return b.str();
  };
  // Welford over the thread's elements, one combination, a second read to
  // normalize.
  auto streaming_body = [&]() {
    std::ostringstream b;
    b << "    float cnt = 0.0f, mean = 0.0f, m2 = 0.0f;\n"
      << "    for (long long e = t; e < " << L << "LL; e += " << tpr << ") {\n"
      << "      const float x = " << load_expr(in.dtype, "in[" + in_at + "]") << ";\n"
      << "      cnt += 1.0f;\n"
      << (rms ? "      m2 += x * x;\n"
              : "      const float d = x - mean;\n"
                "      mean += d / cnt;\n"
                "      m2 += d * (x - mean);\n")
      << "    }\n";
    std::ostringstream c;
    emit_row_combine(c, tpr);
    b << c.str()
      << "    const float rstd = rsqrtf(m2 / " << Lf << " + " << eps << ");\n"
      << "    for (long long e = t; e < " << L << "LL; e += " << tpr << ") {\n"
      << "      const float x = " << load_expr(in.dtype, "in[" + in_at + "]") << ";\n"
      << "      out[base + " << elem_off << "] = " << store_expr(out.dtype, normalized("x", 0)) << ";\n"
      << "    }\n";
    return b.str();
  };

  std::ostringstream s;
  s << "#ifndef KILN_WELFORD_COMBINE\n" << kCombine << "#endif\n";
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
  if (strided)
    s << "  const long long ibase = " << plan.input_base << "LL + "
      << flat_offset("row", plan.row_shape, slice(plan.input_coef, 0, nr)) << ";\n";
  if (affine) s << "  const long long pbase = " << prow_off << ";\n";
  if (tpr > 32)
    s << "  __shared__ float kiln_part_n[" << tpr / 32 << "], kiln_part_mean[" << tpr / 32 << "], kiln_part_m2["
      << tpr / 32 << "];\n";
  if (!l.cached) {
    s << "  {\n" << streaming_body() << "  }\n";
  } else if (l.vector == 1) {
    s << "  {\n" << cached_body(1) << "  }\n";
  } else {
    // Vector accesses need in and out aligned to the vector (every offset
    // is a multiple of it); device-resident engine inputs and outputs may
    // not be: then scalars, in registers when they fit.
    const int64_t in_bytes = l.vector * static_cast<int64_t>(engine::dtype_size(in.dtype));
    const int64_t out_bytes = l.vector * static_cast<int64_t>(engine::dtype_size(out.dtype));
    const bool scalar_fits = (L + tpr - 1) / tpr <= kNormMaxCachedPerThread;
    s << "  if (((unsigned long long)in % " << in_bytes << "ULL) == 0 && ((unsigned long long)out % " << out_bytes
      << "ULL) == 0) {\n"
      << cached_body(l.vector) << "  } else {\n"
      << (scalar_fits ? cached_body(1) : streaming_body()) << "  }\n";
  }
  s << "}\n";
  kernel.source = s.str();
  return kernel;
}

}  // namespace kiln::ops
