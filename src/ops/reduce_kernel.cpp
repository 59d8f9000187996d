#include "ops/reduce_kernel.h"

#include <algorithm>
#include <sstream>

#include "codegen/cuda_dtype.h"

namespace kiln::ops {
using codegen::affine_offset;
using codegen::load_expr;
using codegen::storage_type;
using codegen::store_expr;
namespace {

// Offset of element `var` of the row-major `shape` in a tensor where those
// dims have `strides`.
std::string offset_expr(const std::string& var, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& strides) {
  std::ostringstream expr;
  bool first = true;
  int64_t step = 1;
  for (size_t j = shape.size(); j-- > 0;) {
    if (shape[j] != 1) {
      if (!first) expr << " + ";
      first = false;
      expr << "((" << var << " / " << step << "LL) % " << shape[j] << "LL) * " << strides[j] << "LL";
    }
    step *= shape[j];
  }
  return first ? "0" : expr.str();
}

constexpr unsigned kColumnRows = 8;

}  // namespace

bool reduce_column_shape(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims, int64_t& outer,
                         int64_t& reduced, int64_t& inner) {
  if (dims.empty()) return false;
  for (size_t i = 1; i < dims.size(); ++i)
    if (dims[i] != dims[i - 1] + 1) return false;
  outer = reduced = inner = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t x = shape[d];
    if (static_cast<int64_t>(d) < dims.front()) outer *= x;
    else if (static_cast<int64_t>(d) <= dims.back()) reduced *= x;
    else inner *= x;
  }
  return inner >= 16 && outer <= 65535 && reduced > 0;
}

ReduceKernel generate_reduce_kernel(const ir::Graph& graph, const ReducePlan& plan, const std::string& name) {
  const ir::Value& in = graph.value(plan.input);
  const ir::Value& out = graph.value(plan.out);
  ReduceKernel kernel;
  int64_t outer = 0, red = 0, inner = 0;
  if (reduce_column_shape(in.shape, plan.dims, outer, red, inner)) {
    std::string init = "0.0f", combine = "acc + v", finish = "acc";
    if (plan.kind == ReducePlan::Kind::kMax) {
      init = "-__int_as_float(0x7f800000)";
      combine = "kiln_maximum(acc, v)";
    } else if (plan.kind == ReducePlan::Kind::kMean) {
      finish = "acc / " + std::to_string(red) + ".0f";
    }
    std::ostringstream src;
    src << "extern \"C\" __global__ void __launch_bounds__(" << 32 * kColumnRows << ") " << name << "(\n    "
        << storage_type(out.dtype) << "* __restrict__ out, const " << storage_type(in.dtype)
        << "* __restrict__ in, long long n_out) {\n"
        << "  __shared__ float part[" << kColumnRows << "][33];\n"
        << "  const long long col = (long long)blockIdx.x * 32 + threadIdx.x;\n"
        << "  const long long o = blockIdx.y;\n"
        << "  float acc = " << init << ";\n"
        << "  if (col < " << inner << "LL) {\n"
        << "    const " << storage_type(in.dtype) << "* x = in + o * " << red * inner << "LL + col;\n"
        << "    for (long long r = threadIdx.y; r < " << red << "LL; r += " << kColumnRows << ") {\n"
        << "      const float v = " << load_expr(in.dtype, "x[r * " + std::to_string(inner) + "LL]") << ";\n"
        << "      acc = " << combine << ";\n"
        << "    }\n"
        << "  }\n"
        << "  part[threadIdx.y][threadIdx.x] = acc;\n"
        << "  __syncthreads();\n"
        << "  if (threadIdx.y != 0 || col >= " << inner << "LL) return;\n"
        << "  #pragma unroll\n"
        << "  for (int y = 1; y < " << kColumnRows << "; ++y) {\n"
        << "    const float v = part[y][threadIdx.x];\n"
        << "    acc = " << combine << ";\n"
        << "  }\n"
        << "  out[o * " << inner << "LL + col] = " << store_expr(out.dtype, finish) << ";\n"
        << "}\n";
    kernel.source = src.str();
    kernel.grid[0] = static_cast<uint32_t>((inner + 31) / 32);
    kernel.grid[1] = static_cast<uint32_t>(outer);
    kernel.block[0] = 32;
    kernel.block[1] = kColumnRows;
    return kernel;
  }
  std::vector<int64_t> in_strides(in.shape.size(), 1);
  for (size_t d = in.shape.size(); d-- > 1;) in_strides[d - 1] = in_strides[d] * in.shape[d];
  // Split the input's dims into kept (indexed by the output element) and
  // reduced (walked by the lanes).
  std::vector<int64_t> kept_shape, kept_strides, red_shape, red_strides;
  for (size_t d = 0; d < in.shape.size(); ++d) {
    bool reduced = std::find(plan.dims.begin(), plan.dims.end(), static_cast<int64_t>(d)) != plan.dims.end();
    (reduced ? red_shape : kept_shape).push_back(in.shape[d]);
    (reduced ? red_strides : kept_strides).push_back(in_strides[d]);
  }
  int64_t reduced = ir::numel_of(red_shape);

  std::string init = "0.0f", combine = "acc + v", finish = "acc";
  if (plan.kind == ReducePlan::Kind::kMax) {
    init = "-__int_as_float(0x7f800000)";
    combine = "kiln_maximum(acc, v)";
  } else if (plan.kind == ReducePlan::Kind::kMean) {
    finish = "acc / " + std::to_string(reduced) + ".0f";
  }
  std::ostringstream src;
  src << "extern \"C\" __global__ void __launch_bounds__(" << kReduceBlock << ") " << name << "(\n    "
      << storage_type(out.dtype) << "* __restrict__ out, const " << storage_type(in.dtype)
      << "* __restrict__ in, long long n_out) {\n"
      << "  const long long o = (long long)blockIdx.x * " << kReduceOutputsPerBlock << " + (threadIdx.x >> 5);\n"
      << "  const int lane = threadIdx.x & 31;\n"
      << "  if (o >= n_out) return;  // whole warps leave together\n"
      << "  const long long base = " << offset_expr("o", kept_shape, kept_strides) << ";\n"
      << "  float acc = " << init << ";\n"
      << "  for (long long r = lane; r < " << reduced << "LL; r += 32) {\n"
      << "    const float v = " << load_expr(in.dtype, "in[base + " + offset_expr("r", red_shape, red_strides) + "]")
      << ";\n"
      << "    acc = " << combine << ";\n"
      << "  }\n"
      << "  for (int s = 16; s > 0; s >>= 1) {\n"
      << "    const float v = __shfl_xor_sync(0xffffffffu, acc, s);\n"
      << "    acc = " << combine << ";\n"
      << "  }\n"
      << "  if (lane == 0) out[o] = " << store_expr(out.dtype, finish) << ";\n"
      << "}\n";
  kernel.source = src.str();
  int64_t n_out = out.numel();
  int64_t blocks = (n_out + kReduceOutputsPerBlock - 1) / kReduceOutputsPerBlock;
  if (blocks > 0x7fffffff) throw CompileError("reduction of '" + in.name + "' has too many outputs");
  kernel.grid[0] = static_cast<uint32_t>(std::max<int64_t>(blocks, 1));
  kernel.block[0] = kReduceBlock;
  return kernel;
}

}  // namespace kiln::ops
