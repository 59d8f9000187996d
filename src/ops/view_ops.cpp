#include "ops/view_ops.h"

#include "ops/dim_arg.h"
#include "ops/op_registry.h"

namespace kiln::ops {

bool is_view_op(const std::string& op) {
  const OpDef* def = find_op(op);
  return def != nullptr && def->role == OpRole::kView;
}

bool is_identity_copy(const ir::Graph& graph, const ir::Node& node) {
  if (node.op != "aten.clone.default" && node.op != "aten._to_copy.default" && node.op != "kiln.cast") return false;
  if (node.inputs.size() != 1 || node.outputs.size() != 1) return false;
  const ir::Value& in = graph.value(node.inputs[0]);
  const ir::Value& out = graph.value(node.outputs[0]);
  return in.dtype == out.dtype && in.shape == out.shape;
}

bool is_constant_permute_op(const std::string& op) {
  return op == "aten.permute_copy.default" || op == "aten.t_copy.default" ||
         op == "aten.transpose_copy.int" || op == "aten.permute.default" ||
         op == "aten.t.default";
}

std::vector<int64_t> permutation_of(const ir::Node& node, size_t rank) {
  std::vector<int64_t> perm(rank);
  for (size_t i = 0; i < rank; ++i) perm[i] = static_cast<int64_t>(i);
  auto norm = [&](int64_t d) {
    const std::string why = normalize_dim(d, rank, "node '" + node.name + "':", &d, false);
    if (!why.empty()) throw CompileError(why);
    return d;
  };
  if (node.op == "aten.permute_copy.default" || node.op == "aten.permute.default") {
    std::vector<int64_t> dims = node.ints_attr("dims");
    if (dims.size() != rank) throw CompileError("node '" + node.name + "': permute dims do not match the rank");
    std::vector<bool> seen(rank, false);
    for (size_t i = 0; i < rank; ++i) {
      perm[i] = norm(dims[i]);
      if (seen[static_cast<size_t>(perm[i])]) throw CompileError("node '" + node.name + "': permute repeats a dimension");
      seen[static_cast<size_t>(perm[i])] = true;
    }
  } else if (node.op == "aten.t_copy.default" || node.op == "aten.t.default") {
    if (rank == 2) std::swap(perm[0], perm[1]);
  } else {  // transpose_copy.int
    int64_t a = norm(node.int_attr("dim0", 0)), b = norm(node.int_attr("dim1", 1));
    std::swap(perm[static_cast<size_t>(a)], perm[static_cast<size_t>(b)]);
  }
  return perm;
}

std::optional<std::vector<int64_t>> view_strides(const std::vector<int64_t>& shape,
                                                    const std::vector<int64_t>& strides,
                                                    const std::vector<int64_t>& new_shape) {
  if (ir::numel_of(shape) != ir::numel_of(new_shape)) return std::nullopt;
  std::vector<int64_t> out(new_shape.size(), 1);
  if (ir::numel_of(shape) == 0) return ir::contiguous_strides(new_shape);
  // Walk the old dims from the innermost, in chunks that are contiguous
  // with each other; each chunk must be made of whole new dims.
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[static_cast<size_t>(d)];
    const bool chunk_ends = d == 0 || (shape[static_cast<size_t>(d - 1)] != 1 &&
                                       strides[static_cast<size_t>(d - 1)] != tensor_numel * chunk_base);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[static_cast<size_t>(view_d)] == 1)) {
      out[static_cast<size_t>(view_d)] = view_numel * chunk_base;
      view_numel *= new_shape[static_cast<size_t>(view_d)];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (d > 0) {
      chunk_base = strides[static_cast<size_t>(d - 1)];
      tensor_numel = view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

FactoredDims factored_dims(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  FactoredDims dims(shape.size());
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1) dims[d].push_back({shape[d], strides[d]});
  return dims;
}

namespace {

// Drops size-1 factors and merges neighbours that are contiguous together.
std::vector<StrideFactor> merged(const std::vector<StrideFactor>& factors) {
  std::vector<StrideFactor> out;
  for (const StrideFactor& f : factors) {
    if (f.size == 1) continue;
    if (!out.empty() && out.back().stride == f.size * f.stride) {
      out.back() = {out.back().size * f.size, f.stride};
    } else {
      out.push_back(f);
    }
  }
  return out;
}

}  // namespace

std::optional<FactoredDims> view_factored(const FactoredDims& dims, const std::vector<int64_t>& new_shape) {
  std::vector<StrideFactor> atoms;
  for (const auto& d : dims) atoms.insert(atoms.end(), d.begin(), d.end());
  atoms = merged(atoms);
  FactoredDims out(new_shape.size());
  size_t next = 0;
  for (size_t d = 0; d < new_shape.size(); ++d) {
    const int64_t target = new_shape[d];
    if (target < 1) return std::nullopt;
    int64_t have = 1;
    while (have < target) {
      if (next == atoms.size()) return std::nullopt;
      StrideFactor& a = atoms[next];
      if (target % (have * a.size) == 0) {  // the whole factor fits
        out[d].push_back(a);
        have *= a.size;
        ++next;
      } else if (target % have == 0 && a.size % (target / have) == 0) {  // cut it: outer part here
        const int64_t k = target / have;
        out[d].push_back({k, a.stride * (a.size / k)});
        a.size /= k;
        have = target;
      } else {
        return std::nullopt;
      }
    }
  }
  if (next != atoms.size()) return std::nullopt;
  return out;
}

std::vector<int64_t> factored_shape(const FactoredDims& dims) {
  std::vector<int64_t> shape;
  for (const auto& d : dims) {
    int64_t n = 1;
    for (const StrideFactor& f : d) n *= f.size;
    shape.push_back(n);
  }
  return shape;
}

std::optional<std::vector<int64_t>> plain_strides(const FactoredDims& dims) {
  std::vector<int64_t> strides;
  for (const auto& d : dims) {
    const std::vector<StrideFactor> m = merged(d);
    if (m.size() > 1) return std::nullopt;
    // A size-1 dim is never stepped along: 0, which no alignment check
    // (the attention kernel's 16-byte loads) can fail on.
    strides.push_back(m.empty() ? 0 : m[0].stride);
  }
  return strides;
}

KILN_REGISTER_OPS(views) {
  for (const char* name : {"aten.view_copy.default", "aten._unsafe_view.default", "aten.view.default",
                           "aten.reshape.default", "aten.squeeze_copy.dims", "aten.squeeze_copy.dim",
                           "aten.squeeze_copy.default", "aten.unsqueeze_copy.default", "aten.alias_copy.default",
                           "aten.flatten.using_ints"}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kView;
    def.check = [](const OpQuery& q) -> std::string {
      if (q.inputs.size() != 1) return q.op + " needs exactly one tensor input";
      if (q.outputs.size() != 1) return "ops with several outputs are not supported yet";
      if (q.inputs[0].dtype != q.outputs[0].dtype) return "view changes dtype";
      if (ir::numel_of(q.inputs[0].shape) != ir::numel_of(q.outputs[0].shape))
        return "view changes the number of elements";
      return "";
    };
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
