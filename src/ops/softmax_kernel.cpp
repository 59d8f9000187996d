#include "ops/softmax_kernel.h"

#include <algorithm>
#include <sstream>

#include "codegen/cuda_dtype.h"

namespace kiln::ops {
using codegen::load_expr;
using codegen::storage_type;
using codegen::store_expr;
namespace {

// NaN-propagating max (a NaN row stays NaN, as in PyTorch), the online
// update of a (max, sum of exp(x - max)) pair by one element, and the
// combination of two pairs; each symmetric, so butterfly partners agree
// bit for bit. A -inf element adds nothing (exp(-inf - -inf) would be NaN).
const char* kHelpers =
    "#ifndef KILN_SOFTMAX_HELPERS\n"
    "#define KILN_SOFTMAX_HELPERS\n"
    "#define KILN_NEG_INF (-__int_as_float(0x7f800000))\n"
    "__device__ __forceinline__ float kiln_smax(float a, float b) { return (b > a || b != b) ? b : a; }\n"
    "__device__ __forceinline__ void kiln_online(float& m, float& s, float x) {\n"
    "  if (x > m || x != x) { s = s * expf(m - x) + 1.0f; m = x; }\n"
    "  else if (x != m) s += expf(x - m);\n"
    "  else if (m != KILN_NEG_INF) s += 1.0f;\n"
    "}\n"
    "__device__ __forceinline__ void kiln_combine(float& ma, float& sa, float mb, float sb) {\n"
    "  const float m = kiln_smax(ma, mb);\n"
    "  sa = (ma == m ? sa : sa * expf(ma - m)) + (mb == m ? sb : sb * expf(mb - m));\n"
    "  ma = m;\n"
    "}\n"
    "#endif\n";

std::string raw_vector_type(int64_t bytes) {
  if (bytes == 16) return "uint4";
  if (bytes == 8) return "uint2";
  if (bytes == 4) return "unsigned int";
  throw CompileError("internal: no vector of " + std::to_string(bytes) + " bytes");
}

const char* kField[] = {".x", ".y", ".z", ".w"};

// Lane i of raw vector `var` (V elements of `d`) as float.
std::string unpack(const std::string& var, engine::DType d, int64_t V, int64_t i) {
  const int64_t size = static_cast<int64_t>(engine::dtype_size(d)), per_word = 4 / size;
  const std::string w = V * size == 4 ? var : var + kField[i / per_word];
  if (d == engine::DType::kFloat32) return "__uint_as_float(" + w + ")";
  const int64_t shift = (i % per_word) * 32 / per_word;
  return load_expr(d, "(unsigned short)((" + w + " >> " + std::to_string(shift) + ") & 0xffffu)");
}

// Reduces `var` over the row's threads with `op` ("kiln_smax" or "+").
void emit_row_reduce(std::ostream& s, const std::string& var, const std::string& op, int64_t tpr) {
  auto apply = [&](const std::string& a, const std::string& b) {
    return op == "+" ? a + " + " + b : op + "(" + a + ", " + b + ")";
  };
  s << "    for (int o = 16; o > 0; o >>= 1) { const float u = __shfl_xor_sync(0xffffffffu, " << var
    << ", o); " << var << " = " << apply(var, "u") << "; }\n";
  if (tpr <= 32) return;
  s << "    if ((t & 31) == 0) kiln_red[t >> 5] = " << var << ";\n"
    << "    __syncthreads();\n"
    << "    " << var << " = kiln_red[0];\n"
    << "    for (int w = 1; w < " << tpr / 32 << "; ++w) " << var << " = " << apply(var, "kiln_red[w]") << ";\n"
    << "    __syncthreads();\n";
}

// Combines the threads' (m, s) over the row's threads.
void emit_row_combine(std::ostream& s, int64_t tpr) {
  s << "    for (int o = 16; o > 0; o >>= 1) {\n"
    << "      const float mb = __shfl_xor_sync(0xffffffffu, m, o);\n"
    << "      const float sb = __shfl_xor_sync(0xffffffffu, s, o);\n"
    << "      kiln_combine(m, s, mb, sb);\n"
    << "    }\n";
  if (tpr <= 32) return;
  s << "    if ((t & 31) == 0) { kiln_red[t >> 5] = m; kiln_red2[t >> 5] = s; }\n"
    << "    __syncthreads();\n"
    << "    m = kiln_red[0]; s = kiln_red2[0];\n"
    << "    for (int w = 1; w < " << tpr / 32 << "; ++w) kiln_combine(m, s, kiln_red[w], kiln_red2[w]);\n";
}

}  // namespace

SoftmaxLaunch softmax_launch(const SoftmaxPlan& plan, size_t elem_bytes, int64_t threads_per_row, int64_t vector) {
  SoftmaxLaunch l;
  const int64_t L = std::max<int64_t>(plan.length, 1);
  if (plan.inner > 1) {
    l.strided = true;
    l.block_x = 32 * static_cast<uint32_t>(L >= 64 ? 8 : L >= 16 ? 4 : 1);  // 32 rows x Y thread rows
    const int64_t blocks = plan.outer * ((plan.inner + 31) / 32);
    if (blocks > 0x7fffffff) throw CompileError("softmax has too many rows (" + std::to_string(plan.rows()) + ")");
    l.grid = static_cast<uint32_t>(std::max<int64_t>(blocks, 1));
    l.per_thread = (L + l.block_x / 32 - 1) / (l.block_x / 32);
    l.cached = false;
    return l;
  }
  const int64_t widest = std::max<int64_t>(16 / static_cast<int64_t>(std::max<size_t>(elem_bytes, 1)), 1);
  int64_t v = vector == 0 ? widest : std::min(vector, widest);
  while (v > 1 && L % v != 0) v /= 2;
  l.vector = v;
  if (threads_per_row != 0) {
    if (threads_per_row < 32 || threads_per_row > kSoftmaxMaxThreadsPerRow || (threads_per_row & (threads_per_row - 1)))
      throw CompileError("internal: threads per row must be a power of two in 32..1024");
    l.threads_per_row = threads_per_row;
  }
  const int64_t units = L / v, target = std::max<int64_t>(kSoftmaxTargetPerThread / v, 1);
  while (threads_per_row == 0 && l.threads_per_row < kSoftmaxMaxThreadsPerRow &&
         (units + l.threads_per_row - 1) / l.threads_per_row > target)
    l.threads_per_row *= 2;
  l.per_thread = (units + l.threads_per_row - 1) / l.threads_per_row * v;
  l.cached = l.per_thread <= kSoftmaxMaxCachedPerThread;
  if (!l.cached) l.vector = 1;  // streaming reads scalars
  const int64_t rows = std::max<int64_t>(plan.rows(), 1);
  l.rows_per_block = l.threads_per_row == 32 ? std::min(kSoftmaxWarpRowsPerBlock, rows) : 1;
  const int64_t blocks = (rows + l.rows_per_block - 1) / l.rows_per_block;
  if (blocks > 0x7fffffff) throw CompileError("softmax has too many rows (" + std::to_string(rows) + ")");
  l.grid = static_cast<uint32_t>(blocks);
  l.block_x = static_cast<uint32_t>(l.threads_per_row * l.rows_per_block);
  return l;
}

SoftmaxKernel generate_softmax_kernel(const ir::Graph& graph, const SoftmaxPlan& plan, const std::string& name,
                                      int64_t threads_per_row, int64_t vector) {
  const ir::Value& in = graph.value(plan.input);
  const ir::Value& out = graph.value(plan.out);
  const int64_t L = plan.length;
  if (L < 1) throw CompileError("softmax '" + out.name + "' over an empty dim");
  if (plan.outer * L * plan.inner != out.numel() || in.numel() != out.numel())
    throw CompileError("internal: softmax '" + out.name + "' shape does not match its rows");
  SoftmaxKernel kernel;
  const size_t bytes = std::max(engine::dtype_size(in.dtype), engine::dtype_size(out.dtype));
  const SoftmaxLaunch l = kernel.launch = softmax_launch(plan, bytes, threads_per_row, vector);
  const std::string Ls = codegen::ll(L);
  // The output of element x given the row's m and s (inv = 1/s, ls = log s).
  // `x` is the input, or (held rows of a softmax) already exp(x - m).
  auto result = [&](const std::string& x, bool is_exp = false) {
    std::string y = plan.log ? "(" + x + " - m - ls)" : is_exp ? "(" + x + " * inv)" : "(expf(" + x + " - m) * inv)";
    if (plan.safe) y = "(m == KILN_NEG_INF ? 0.0f : " + y + ")";
    return store_expr(out.dtype, y);
  };
  auto finish = [&]() { return plan.log ? "    const float ls = logf(s);\n" : "    const float inv = 1.0f / s;\n"; };

  std::ostringstream s;
  s << kHelpers;
  s << "extern \"C\" __global__ void __launch_bounds__(" << l.block_x * l.block_y << ") " << name << "(\n    "
    << storage_type(out.dtype) << "* __restrict__ out, const " << storage_type(in.dtype)
    << "* __restrict__ in, long long n) {\n";

  if (l.strided) {
    const int64_t Y = l.block_x / 32, nib = (plan.inner + 31) / 32, inner = plan.inner;
    s << "  __shared__ float kiln_m[" << Y << "][32], kiln_s[" << Y << "][32];\n"
      << "  const long long o = blockIdx.x / " << nib << "LL;\n"
      << "  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;\n"
      << "  const long long i = (blockIdx.x % " << nib << "LL) * 32 + tx;\n"
      << "  const bool live = i < " << inner << "LL && o * " << L * inner << "LL < n;\n"
      << "  const long long base = o * " << L * inner << "LL + i;\n"
      << "  float m = KILN_NEG_INF, s = 0.0f;\n"
      << "  if (live)\n"
      << "    for (long long e = ty; e < " << Ls << "; e += " << Y << ")\n"
      << "      kiln_online(m, s, " << load_expr(in.dtype, "in[base + e * " + std::to_string(inner) + "LL]") << ");\n"
      << "  kiln_m[ty][tx] = m;\n"
      << "  kiln_s[ty][tx] = s;\n"
      << "  __syncthreads();\n"
      << "  m = kiln_m[0][tx]; s = kiln_s[0][tx];\n"
      << "  for (int y = 1; y < " << Y << "; ++y) kiln_combine(m, s, kiln_m[y][tx], kiln_s[y][tx]);\n"
      << "  if (!live) return;\n"
      << finish()
      << "  for (long long e = ty; e < " << Ls << "; e += " << Y << ") {\n"
      << "    const float x = " << load_expr(in.dtype, "in[base + e * " + std::to_string(inner) + "LL]") << ";\n"
      << "    out[base + e * " << inner << "LL] = " << result("x") << ";\n"
      << "  }\n"
      << "}\n";
    kernel.source = s.str();
    return kernel;
  }

  const int64_t tpr = l.threads_per_row;
  // The row in registers, V elements a vector access.
  auto cached_body = [&](int64_t V) {
    std::ostringstream b;
    const int64_t units = L / V, K = (units + tpr - 1) / tpr;
    const bool ragged = K * tpr != units;
    const std::string guard = ragged ? "if (j < " + std::to_string(units) + ") " : "";
    b << "    float v[" << K * V << "];\n"
      << "    float m = KILN_NEG_INF;\n"
      << "    #pragma unroll\n"
      << "    for (int k = 0; k < " << K << "; ++k) {\n"
      << "      const int j = t + k * " << tpr << ";\n";
    for (int64_t i = 0; i < V; ++i) b << "      v[k * " << V << " + " << i << "] = KILN_NEG_INF;\n";
    b << "      " << guard << "{\n";
    if (V == 1) {
      b << "        v[k] = " << load_expr(in.dtype, "row_in[j]") << ";\n";
    } else {
      const std::string vt = raw_vector_type(V * static_cast<int64_t>(engine::dtype_size(in.dtype)));
      b << "        const " << vt << " r = reinterpret_cast<const " << vt << "*>(row_in)[j];\n";
      for (int64_t i = 0; i < V; ++i)
        b << "        v[k * " << V << " + " << i << "] = " << unpack("r", in.dtype, V, i) << ";\n";
    }
    for (int64_t i = 0; i < V; ++i) b << "        m = kiln_smax(m, v[k * " << V << " + " << i << "]);\n";
    b << "      }\n"
      << "    }\n";
    emit_row_reduce(b, "m", "kiln_smax", tpr);
    b << "    float s = 0.0f;\n"
      << "    #pragma unroll\n"
      << "    for (int k = 0; k < " << K << "; ++k) {\n"
      << "      const int j = t + k * " << tpr << ";\n"
      << "      " << guard << "{\n";
    // softmax keeps exp(x - m) in place of x (one exp an element).
    for (int64_t i = 0; i < V; ++i) {
      const std::string vi = "v[k * " + std::to_string(V) + " + " + std::to_string(i) + "]";
      if (plan.log) b << "        s += expf(" << vi << " - m);\n";
      else b << "        " << vi << " = expf(" << vi << " - m); s += " << vi << ";\n";
    }
    b << "      }\n"
      << "    }\n";
    emit_row_reduce(b, "s", "+", tpr);
    b << finish()
      << "    #pragma unroll\n"
      << "    for (int k = 0; k < " << K << "; ++k) {\n"
      << "      const int j = t + k * " << tpr << ";\n"
      << "      " << guard << "{\n";
    if (V == 1) {
      b << "        row_out[j] = " << result("v[k]", true) << ";\n";
    } else {
      const int64_t size = static_cast<int64_t>(engine::dtype_size(out.dtype)), per_word = 4 / size;
      const std::string vt = raw_vector_type(V * size);
      std::vector<std::string> words(static_cast<size_t>((V + per_word - 1) / per_word));
      for (int64_t i = 0; i < V; ++i) {
        const std::string x = "v[k * " + std::to_string(V) + " + " + std::to_string(i) + "]";
        std::string y = result(x, true);
        std::string bits = out.dtype == engine::DType::kFloat32
                               ? "__float_as_uint(" + y + ")"
                               : "((unsigned int)" + y + " << " + std::to_string((i % per_word) * 32 / per_word) + ")";
        std::string& w = words[static_cast<size_t>(i / per_word)];
        w = w.empty() ? bits : w + " | " + bits;
      }
      b << "        " << vt << " r;\n";
      for (size_t w = 0; w < words.size(); ++w)
        b << "        r" << (words.size() == 1 ? "" : kField[w]) << " = " << words[w] << ";\n";
      b << "        reinterpret_cast<" << vt << "*>(row_out)[j] = r;\n";
    }
    b << "      }\n"
      << "    }\n";
    return b.str();
  };
  // Online (max, sum) per thread, one combination, a second read to write.
  auto streaming_body = [&]() {
    std::ostringstream b;
    b << "    float m = KILN_NEG_INF, s = 0.0f;\n"
      << "    for (long long e = t; e < " << Ls << "; e += " << tpr << ") kiln_online(m, s, "
      << load_expr(in.dtype, "row_in[e]") << ");\n";
    emit_row_combine(b, tpr);
    b << finish()
      << "    for (long long e = t; e < " << Ls << "; e += " << tpr << ") {\n"
      << "      const float x = " << load_expr(in.dtype, "row_in[e]") << ";\n"
      << "      row_out[e] = " << result("x") << ";\n"
      << "    }\n";
    return b.str();
  };

  if (l.rows_per_block > 1)
    s << "  const long long row = (long long)blockIdx.x * " << l.rows_per_block << " + (threadIdx.x >> 5);\n"
      << "  const int t = threadIdx.x & 31;\n";
  else
    s << "  const long long row = blockIdx.x;\n"
      << "  const int t = threadIdx.x;\n";
  s << "  if (row >= n / " << Ls << ") return;  // a whole row's threads leave together\n"
    << "  const " << storage_type(in.dtype) << "* row_in = in + row * " << Ls << ";\n"
    << "  " << storage_type(out.dtype) << "* row_out = out + row * " << Ls << ";\n";
  if (tpr > 32) s << "  __shared__ float kiln_red[" << tpr / 32 << "], kiln_red2[" << tpr / 32 << "];\n";
  if (!l.cached) {
    s << "  {\n" << streaming_body() << "  }\n";
  } else if (l.vector == 1) {
    s << "  {\n" << cached_body(1) << "  }\n";
  } else {
    // Vector accesses need in and out aligned (every row starts at a
    // multiple of the vector); device-resident engine tensors may not be.
    const int64_t in_bytes = l.vector * static_cast<int64_t>(engine::dtype_size(in.dtype));
    const int64_t out_bytes = l.vector * static_cast<int64_t>(engine::dtype_size(out.dtype));
    const bool scalar_fits = (L + tpr - 1) / tpr <= kSoftmaxMaxCachedPerThread;
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
