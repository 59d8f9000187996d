#include "ops/gather_ops.h"

#include <algorithm>
#include <variant>

#include "codegen/cuda_dtype.h"
#include "ops/dim_arg.h"
#include "ops/gather_kernel.h"
#include "ops/op_registry.h"

namespace kiln::ops {
namespace {

using Shape = std::vector<int64_t>;


bool int_attr(const std::map<std::string, ir::Attr>& attrs, const std::string& key, int64_t* out) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return false;
  if (auto* i = std::get_if<int64_t>(&it->second)) {
    *out = *i;
    return true;
  }
  return false;
}

// The element offset of an index tensor of `shape`, broadcast (right-aligned)
// over output dims [first, first + rank) of an output of rank `out_rank`.
AffineMap broadcast_map(const Shape& shape, size_t first, size_t rank, size_t out_rank) {
  AffineMap m;
  m.coef.assign(out_rank, 0);
  const std::vector<int64_t> strides = ir::contiguous_strides(shape);
  const size_t lead = rank - shape.size();
  for (size_t j = 0; j < shape.size(); ++j)
    if (shape[j] != 1) m.coef[first + lead + j] = strides[j];
  return m;
}

// Reads the node (op, attrs, shapes: inputs[0] is the data, then the
// indices) into `p` (source and index maps; value ids are set by the
// caller). An error message or "".
std::string describe(const std::string& op, const std::map<std::string, ir::Attr>& attrs,
                     const std::vector<Shape>& in, const Shape& out, GatherPlan& p) {
  if (in.size() < 2) return op + " needs a data tensor and an index tensor";
  const Shape& data = in[0];
  for (int64_t d : data)
    if (d < 1) return op + " of an empty tensor is not supported";
  for (int64_t d : out)
    if (d < 1) return op + " with an empty output is not supported";
  const size_t n = data.size(), r = out.size();
  p.indices.clear();
  p.source.assign(n, 0);
  if (op == "aten.embedding.default") {
    if (in.size() != 2 || n != 2) return "embedding needs a 2-D weight and one index tensor";
    const Shape& idx = in[1];
    Shape expect = idx;
    expect.push_back(data[1]);
    if (expect != out) return "embedding output shape does not match its indices and weight";
    p.source = {-1, static_cast<int>(idx.size())};
    p.indices.push_back({-1, broadcast_map(idx, 0, idx.size(), r)});
    return "";
  }
  int64_t dim = 0;
  if (op == "aten.index_select.default" || op == "aten.gather.default") {
    if (in.size() != 2) return op + " needs one index tensor";
    if (!int_attr(attrs, "dim", &dim)) return op + ": dim must be an integer";
    const std::string why = normalize_dim(dim, n, op, &dim, false);
    if (!why.empty()) return why;
    const size_t d = static_cast<size_t>(dim);
    const Shape& idx = in[1];
    for (size_t s = 0; s < n; ++s) p.source[s] = static_cast<int>(s);
    p.source[d] = -1;
    if (op == "aten.index_select.default") {
      if (idx.size() > 1) return "index_select needs a 0-D or 1-D index";
      Shape expect = data;
      expect[d] = ir::numel_of(idx);
      if (expect != out) return "index_select output shape does not match its input and index";
      AffineMap m;
      m.coef.assign(r, 0);
      m.coef[d] = 1;
      p.indices.push_back({-1, m});
      return "";
    }
    if (idx.size() != n || idx != out) return "gather needs an index of the input's rank, shaped as the output";
    for (size_t s = 0; s < n; ++s)
      if (s != d && idx[s] > data[s]) return "gather index is larger than the input in a dim other than dim";
    p.indices.push_back({-1, AffineMap{0, ir::contiguous_strides(idx)}});
    return "";
  }
  if (op == "aten.index.Tensor") {
    const size_t k = in.size() - 1;
    if (k > n) return "index.Tensor with more index tensors than input dims";
    // Which data dim each index tensor indexes: the leading k, or where the
    // list had its tensors (x[:, :, idx] is [None, None, idx]).
    std::vector<size_t> dim_of(k);
    for (size_t j = 0; j < k; ++j) dim_of[j] = j;
    if (auto it = attrs.find("indices_positions"); it != attrs.end()) {
      const auto* pos = std::get_if<std::vector<int64_t>>(&it->second);
      if (pos == nullptr || pos->size() != k) return "index.Tensor index positions do not match its index tensors";
      for (size_t j = 0; j < k; ++j) {
        if ((*pos)[j] < 0 || (*pos)[j] >= static_cast<int64_t>(n) || (j > 0 && (*pos)[j] <= (*pos)[j - 1]))
          return "index.Tensor index positions out of order or range";
        dim_of[j] = static_cast<size_t>((*pos)[j]);
      }
    }
    size_t b = 0;  // broadcast rank of the indices
    for (size_t j = 1; j < in.size(); ++j) b = std::max(b, in[j].size());
    Shape bshape(b, 1);
    for (size_t j = 1; j < in.size(); ++j) {
      const size_t lead = b - in[j].size();
      for (size_t q = 0; q < in[j].size(); ++q) {
        int64_t& have = bshape[lead + q];
        const int64_t want = in[j][q];
        if (have != 1 && want != 1 && have != want) return "index.Tensor indices do not broadcast together";
        if (want != 1) have = want;
      }
    }
    // PyTorch's rule: indexed dims next to each other put the broadcast
    // index dims where the first of them was; apart, the index dims go first.
    // The other data dims follow in order.
    const bool adjacent = k == 0 || dim_of[k - 1] - dim_of[0] == k - 1;
    const size_t at = adjacent && k > 0 ? dim_of[0] : 0;  // output dim of the first index dim
    Shape expect;
    std::vector<int> index_of(n, -1);  // data dim -> its index tensor
    for (size_t j = 0; j < k; ++j) index_of[dim_of[j]] = static_cast<int>(j);
    size_t next = 0;  // the next output dim of a non-indexed data dim
    for (size_t s = 0; s < n; ++s) {
      if (index_of[s] >= 0) {
        p.source[s] = -index_of[s] - 1;
        continue;
      }
      if (next == at) next += b;  // the index dims' place
      p.source[s] = static_cast<int>(next++);
    }
    expect.assign(std::max(next, at + b), 0);
    for (size_t q = 0; q < b; ++q) expect[at + q] = bshape[q];
    for (size_t s = 0; s < n; ++s)
      if (p.source[s] >= 0) expect[static_cast<size_t>(p.source[s])] = data[s];
    if (expect != out) return "index.Tensor output shape does not match its input and indices";
    for (size_t j = 1; j < in.size(); ++j) p.indices.push_back({-1, broadcast_map(in[j], at, b, r)});
    return "";
  }
  return op + " is not a gather op";
}

const char* label_of(const std::string& op) {
  if (op == "aten.embedding.default") return "embedding";
  if (op == "aten.index_select.default") return "index_select";
  if (op == "aten.gather.default") return "gather";
  return "index";
}

}  // namespace

std::vector<int> GatherPlan::reads() const {
  std::vector<int> r{data};
  for (const GatherIndex& i : indices) r.push_back(i.value);
  return r;
}

bool is_gather_op(const std::string& op) {
  return op == "aten.embedding.default" || op == "aten.index_select.default" || op == "aten.gather.default" ||
         op == "aten.index.Tensor";
}

std::string check_gather(const OpQuery& q) {
  if (q.outputs.size() != 1) return q.op + " needs one output";
  if (q.inputs.empty()) return q.op + " needs a data tensor";
  const TensorInfo& data = q.inputs[0];
  if (q.op == "aten.embedding.default" && data.dtype != q.outputs[0].dtype)
    return "embedding output dtype differs from its weight's";
  if (q.op != "aten.embedding.default" && data.dtype != q.outputs[0].dtype)
    return q.op + " output dtype differs from its input's";
  for (size_t i = 1; i < q.inputs.size(); ++i)
    if (!codegen::is_integer(q.inputs[i].dtype))
      return q.op + " index " + std::to_string(i - 1) + " is " + engine::dtype_name(q.inputs[i].dtype) +
             " (boolean mask indexing has a data-dependent shape and is not supported)";
  std::vector<Shape> shapes;
  for (const TensorInfo& t : q.inputs) shapes.push_back(t.shape);
  GatherPlan p;
  return describe(q.op, q.attrs, shapes, q.outputs[0].shape, p);
}

GatherPlan plan_gather(const ir::Graph& graph, const ir::Node& node) {
  if (node.inputs.size() < 2 || node.outputs.size() != 1)
    throw CompileError("node '" + node.name + "': " + node.op + " needs data, indices and one output");
  std::vector<Shape> shapes;
  for (int id : node.inputs) shapes.push_back(graph.value(id).shape);
  GatherPlan p;
  std::string why = describe(node.op, node.attrs, shapes, graph.value(node.outputs[0]).shape, p);
  if (!why.empty()) throw CompileError("node '" + node.name + "': " + why);
  // Float data may differ from the output (a float32 graph input in a
  // float16 engine: the kernel converts); other dtypes are copied as bytes.
  const engine::DType from = graph.value(node.inputs[0]).dtype, to = graph.value(node.outputs[0]).dtype;
  auto is_float = [](engine::DType d) { return d == engine::DType::kFloat32 || d == engine::DType::kFloat16 ||
                                               d == engine::DType::kBFloat16; };
  if (from != to && !(is_float(from) && is_float(to)))
    throw CompileError("node '" + node.name + "': output dtype differs from the data's");
  p.data = node.inputs[0];
  p.out = node.outputs[0];
  for (size_t j = 0; j < p.indices.size(); ++j) {
    p.indices[j].value = node.inputs[j + 1];
    if (!codegen::is_integer(graph.value(p.indices[j].value).dtype))
      throw CompileError("node '" + node.name + "': index '" + graph.value(p.indices[j].value).name +
                         "' is not int64 or int32");
  }
  return p;
}

void GatherPlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_gather");
  GatherLaunch launch;
  ctx.add_source(generate_gather_kernel(ctx.graph(), *this, k.function, &launch));
  k.grid[0] = launch.grid;
  k.block[0] = kGatherBlock;
  k.args = {ctx.tensor_arg(out), ctx.tensor_arg(data)};
  for (const GatherIndex& i : indices) k.args.push_back(ctx.tensor_arg(i.value));
  k.args.push_back(LowerContext::int_arg(ctx.graph().value(out).numel()));
}

namespace {
std::vector<IndexRange> gather_index_ranges(const ir::Graph& graph, const ir::Node& node) {
  const GatherPlan p = plan_gather(graph, node);
  const ir::Value& data = graph.value(p.data);
  // Advanced indexing wraps negative indices as Python does; embedding, index_select and gather
  // take [0, size) only.
  const bool wraps = node.op == "aten.index.Tensor";
  std::vector<IndexRange> ranges;
  for (size_t d = 0; d < p.source.size(); ++d) {
    if (p.source[d] >= 0) continue;
    const int j = -p.source[d] - 1;
    const int64_t size = data.shape[d];
    ranges.push_back({j + 1, wraps ? -size : 0, size,
                      "dim " + std::to_string(d) + " (size " + std::to_string(size) + ") of '" + data.name + "'"});
  }
  return ranges;
}
}  // namespace

KILN_REGISTER_OPS(gather) {
  for (const char* name :
       {"aten.embedding.default", "aten.index_select.default", "aten.gather.default", "aten.index.Tensor"}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kStep;
    def.check = check_gather;
    def.any_dtype = true;  // the data may be any dtype; the indices are checked below
    def.index_inputs = std::string(name) == "aten.index.Tensor" ? std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}
                                                                  : std::vector<int>{1};
    def.index_ranges = gather_index_ranges;
    def.plan = [](PlanContext& ctx, int node) {
      const ir::Node& n = ctx.graph().nodes()[static_cast<size_t>(node)];
      ctx.emit(PlannedOp(label_of(n.op), plan_gather(ctx.graph(), n)));
    };
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
