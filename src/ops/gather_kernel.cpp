#include "ops/gather_kernel.h"

#include <algorithm>
#include <sstream>

#include "codegen/cuda_dtype.h"

namespace kiln::ops {
namespace {

using codegen::ll;

const char* unit_type(int64_t bytes) {
  switch (bytes) {
    case 16: return "kiln_u128";
    case 8: return "unsigned long long";
    case 4: return "unsigned int";
    case 2: return "unsigned short";
    default: return "unsigned char";
  }
}

// The widest unit (16, 8, 4 bytes, else one element) dividing `bytes`.
int64_t vector_bytes(int64_t bytes, int64_t elem) {
  for (int64_t v : {16, 8, 4})
    if (v > elem && bytes % v == 0) return v;
  return elem;
}

}  // namespace

std::string wrap_clamp_index(const std::string& var, int64_t size, const std::string& indent) {
  return indent + "if (" + var + " < 0) " + var + " += " + ll(size) + ";\n" + indent + var + " = " + var + " < 0 ? 0 : (" +
         var + " >= " + ll(size) + " ? " + ll(size - 1) + " : " + var + ");\n";
}

std::string generate_gather_kernel(const ir::Graph& graph, const GatherPlan& plan, const std::string& name,
                                   GatherLaunch* launch) {
  const ir::Value& data = graph.value(plan.data);
  const ir::Value& out = graph.value(plan.out);
  const size_t n = data.shape.size(), r = out.shape.size();
  if (plan.source.size() != n) throw CompileError("internal: gather plan does not cover the data's dims");
  for (const GatherIndex& g : plan.indices)
    if (g.map.coef.size() != r) throw CompileError("internal: gather index map does not cover the output's dims");
  std::vector<int64_t> dstride(n, 1);
  for (size_t d = n; d-- > 1;) dstride[d - 1] = dstride[d] * data.shape[d];

  // The trailing block: data dims copied whole onto the last output dims,
  // on which no index depends.
  size_t t = 0;
  while (t < n && t < r) {
    const size_t s = n - 1 - t, o = r - 1 - t;
    if (plan.source[s] != static_cast<int>(o) || data.shape[s] != out.shape[o]) break;
    bool free = true;
    for (const GatherIndex& g : plan.indices) free = free && g.map.coef[o] == 0;
    if (!free) break;
    ++t;
  }
  // A float32 graph input gathered into a float16 engine (precision pass):
  // element by element with the dtype conversion, else raw bytes.
  const bool convert = data.dtype != out.dtype;
  const int64_t elem = static_cast<int64_t>(engine::dtype_size(convert ? data.dtype : out.dtype));
  int64_t block = 1;
  for (size_t j = r - t; j < r; ++j) block *= out.shape[j];
  const int64_t rows = out.numel() / block;
  const int64_t bytes = block * elem;
  const int64_t vec = convert ? elem : vector_bytes(bytes, elem);

  std::ostringstream s;
  // A 16-byte unit, declared once per module (the host test shim has no uint4).
  s << "#ifndef KILN_U128\n#define KILN_U128\nstruct alignas(16) kiln_u128 { unsigned long long lo, hi; };\n#endif\n";
  s << "extern \"C\" __global__ void __launch_bounds__(" << kGatherBlock << ") " << name
    << "(\n    unsigned char* __restrict__ out, const unsigned char* __restrict__ data";
  for (size_t k = 0; k < plan.indices.size(); ++k)
    s << ",\n    const " << codegen::storage_type(graph.value(plan.indices[k].value).dtype) << "* __restrict__ idx"
      << k;
  s << ",\n    long long n_out) {\n";
  // Vectors only when both bases are aligned to them (engine inputs and
  // outputs come from the caller); else element by element.
  s << "  const bool wide = ((((unsigned long long)out) | ((unsigned long long)data)) & " << (vec - 1)
    << "ULL) == 0ULL;\n"
    << "  const long long unit = wide ? " << ll(vec) << " : " << ll(elem) << ";\n"
    << "  const long long per_row = " << ll(bytes) << " / unit;\n"
    << "  const long long total = " << ll(rows) << " * per_row;\n"
    << "  const long long stride = (long long)gridDim.x * " << kGatherBlock << ";\n"
    << "  for (long long i = (long long)blockIdx.x * " << kGatherBlock
    << " + threadIdx.x; i < total; i += stride) {\n"
    << "    const long long row = i / per_row;\n"
    << "    const long long c = i - row * per_row;\n";
  // Output coordinates of the row (dims before the block).
  int64_t inner = 1;
  for (size_t j = r - t; j-- > 0;) {
    s << "    const long long o" << j << " = (row / " << ll(inner) << ") % " << ll(out.shape[j]) << ";\n";
    inner *= out.shape[j];
  }
  s << "    long long src = 0;\n";
  for (size_t d = 0; d + t < n; ++d) {
    const int src = plan.source[d];
    if (src >= 0) {
      s << "    src += o" << src << " * " << ll(dstride[d]) << ";\n";
      continue;
    }
    const size_t k = static_cast<size_t>(-src - 1);
    const AffineMap& m = plan.indices.at(k).map;
    std::string offset = m.base != 0 ? ll(m.base) : "";
    for (size_t j = 0; j < r; ++j) {
      if (m.coef[j] == 0) continue;
      if (j >= r - t) throw CompileError("internal: gather index depends on a block dim");
      offset += (offset.empty() ? "" : " + ") + std::string("o") + std::to_string(j) + " * " + ll(m.coef[j]);
    }
    if (offset.empty()) offset = "0";
    const int64_t size = data.shape[d];
    s << "    {\n      long long v = (long long)idx" << k << "[" << offset << "];\n"
      << wrap_clamp_index("v", size, "      ") << "      src += v * " << ll(dstride[d]) << ";\n    }\n";
  }
  const std::string vt = unit_type(vec), et = unit_type(elem);
  if (convert) {
    const std::string from = std::string("((const ") + codegen::storage_type(data.dtype) + "*)data)[src + c]";
    s << "    ((" << codegen::storage_type(out.dtype) << "*)out)[row * " << ll(block) << " + c] = "
      << codegen::store_expr(out.dtype, codegen::load_expr(data.dtype, from)) << ";\n  }\n}\n";
  } else {
  s << "    if (wide)\n"
    << "      ((" << vt << "*)(out + row * " << ll(bytes) << "))[c] = ((const " << vt << "*)(data + src * " << ll(elem)
    << "))[c];\n"
    << "    else\n"
    << "      ((" << et << "*)(out + row * " << ll(bytes) << "))[c] = ((const " << et << "*)(data + src * "
    << ll(elem) << "))[c];\n"
    << "  }\n}\n";
  }
  const int64_t units = rows * (bytes / vec);
  launch->grid = static_cast<uint32_t>(
      std::min<int64_t>(std::max<int64_t>(1, (units + kGatherBlock - 1) / kGatherBlock), 65536));
  return s.str();
}

}  // namespace kiln::ops
