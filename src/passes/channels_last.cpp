// Channels-last layout for convolution stacks. Each 4-D NCHW convolution or
// pooling op becomes its channels-last form (kiln.conv2d_nhwc with an OHWI
// weight permuted at export, kiln.*_pool2d_nhwc), and the NHWC form of a
// value travels through the ops that do not care about layout, so the
// permutes that the rewrite implies cancel:
//   * elementwise ops with one tensor input run on the NHWC tensor;
//   * binary elementwise ops run in NHWC when every operand has (or cheaply
//     gets) an NHWC form: another NHWC value, a constant (permuted at export),
//     a scalar, or a tensor whose permute only moves size-1 dims (a view);
//   * sum/mean/amax map their dims through the permute;
//   * layer/group/batch-statistics norms read the NHWC tensor with NHWC
//     strides (kiln.*_nhwc, ops/norm_ops.h);
//   * a permute between the two layouts costs nothing when the other layout
//     exists: NCHW -> NHWC of a value with an NHWC form is that form, and
//     NHWC -> NCHW of a value gives the result that value as its NHWC form
//     (ConvNeXt's LayerNorm2d: permute, layer norm over channels, permute
//     back; an NHWC image permuted for a conv);
//   * everything else reads NCHW, made on demand by one layout kernel (or a
//     view when the permute only moves size-1 dims) and shared by all such
//     readers.
// So conversions appear only at the edges of a convolution stack and where a
// consumer truly needs NCHW order. Equivalent to inserting permute pairs
// around each conv and cancelling them, done in one forward walk.
#include <algorithm>

#include "ops/conv_ops.h"
#include "ops/norm_ops.h"
#include "ops/op_registry.h"
#include "ops/pool_ops.h"
#include "ops/reduce_ops.h"
#include "ops/view_ops.h"
#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

const std::vector<int64_t> kToNhwc = {0, 2, 3, 1};  // NHWC dim j is NCHW dim kToNhwc[j]
const std::vector<int64_t> kToNchw = {0, 3, 1, 2};

std::vector<int64_t> permuted(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm) {
  std::vector<int64_t> out;
  for (int64_t p : perm) out.push_back(shape.at(static_cast<size_t>(p)));
  return out;
}

// True when permuting `shape` by `perm` keeps the order of the dims that are
// not 1, so the permute is a reinterpretation of the same bytes.
bool moves_only_unit_dims(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm) {
  int64_t last = -1;
  for (int64_t p : perm) {
    if (shape[static_cast<size_t>(p)] == 1) continue;
    if (p < last) return false;
    last = p;
  }
  return true;
}

bool is_reduce_with_dims(const std::string& op) {
  return op == "aten.sum.dim_IntList" || op == "aten.mean.dim" || op == "aten.amax.default";
}

class ChannelsLast {
 public:
  explicit ChannelsLast(const ir::Graph& graph)
      : g_(graph), rw_(graph), consumers_(consumers_of(graph)), nhwc_(graph.values().size(), -1),
        nchw_(graph.values().size(), -1) {
    for (int id : graph.inputs()) nchw_[static_cast<size_t>(id)] = rw_.map(id);
    for (const ir::Value& v : graph.values())
      if (v.is_constant) nchw_[static_cast<size_t>(v.id)] = rw_.map(v.id);
  }

  ir::Graph run() {
    for (const ir::Node& node : g_.nodes()) {
      if (node.op == "kiln.folded") continue;
      if (ops::is_conv_op(node.op)) {
        conv(node);
      } else if (ops::is_pool_op(node.op)) {
        pool(node);
      } else if (!try_permute(node) && !try_norm(node) && !try_pointwise(node) && !try_reduce(node)) {
        std::vector<int> inputs;
        for (int in : node.inputs) inputs.push_back(as_nchw(in));
        rw_.copy_node(node, inputs);
        for (int o : node.outputs) nchw_[static_cast<size_t>(o)] = rw_.map(o);
      }
    }
    std::vector<int> outputs;
    for (int o : g_.outputs()) outputs.push_back(as_nchw(o));
    rw_.out().set_outputs(outputs);
    rw_.out().verify();
    return std::move(rw_.out());
  }

 private:
  const ir::Value& old(int id) const { return g_.value(id); }

  int as_nchw(int id) {
    int& cached = nchw_[static_cast<size_t>(id)];
    if (cached >= 0) return cached;
    int src = nhwc_.at(static_cast<size_t>(id));
    if (src < 0) throw CompileError("internal: value '" + old(id).name + "' has no layout");
    cached = relayout(src, kToNchw, old(id).name + "_nchw");
    return cached;
  }

  // The NHWC form of a 4-D value, made if needed (constants permute at
  // export, unit-dim permutes are views, others cost a layout kernel).
  int as_nhwc(int id) {
    int& cached = nhwc_[static_cast<size_t>(id)];
    if (cached >= 0) return cached;
    const ir::Value& v = old(id);
    if (v.is_constant) {
      cached = rw_.add_constant(v.name + "_nhwc", v.dtype, permuted(v.shape, kToNhwc),
                                permute_constant_data(v, kToNhwc));
      return cached;
    }
    cached = relayout(as_nchw(id), kToNhwc, v.name + "_nhwc");
    return cached;
  }

  // Whether `id` has an NHWC form without a layout kernel.
  bool cheap_nhwc(int id) const {
    const ir::Value& v = old(id);
    if (v.shape.size() != 4) return false;
    return nhwc_[static_cast<size_t>(id)] >= 0 || v.is_constant || moves_only_unit_dims(v.shape, kToNhwc);
  }

  int relayout(int new_id, const std::vector<int64_t>& perm, const std::string& name) {
    const ir::Value& v = rw_.out().value(new_id);
    std::vector<int64_t> shape = permuted(v.shape, perm);
    if (moves_only_unit_dims(v.shape, perm))
      return rw_.emit("aten.view_copy.default", name, {new_id}, {{"size", shape}}, v.dtype, shape);
    return rw_.emit("aten.permute_copy.default", name, {new_id}, {{"dims", perm}}, v.dtype, shape);
  }

  void conv(const ir::Node& node) {
    const ir::Value& w = old(node.inputs.at(1));
    const ir::Value& y = old(node.outputs.at(0));
    if (w.shape.size() != 4 || !w.is_constant || y.shape.size() != 4)
      throw CompileError("node '" + node.name + "': only 2-D convolutions with constant weights are supported");
    std::vector<int> inputs = {as_nhwc(node.inputs[0]), as_nhwc(node.inputs[1])};
    if (node.inputs.size() > 2) inputs.push_back(rw_.map(node.inputs[2]));
    std::map<std::string, ir::Attr> attrs;
    ops::ConvParams p = ops::conv_params(node);
    attrs["stride"] = std::vector<int64_t>{p.stride[0], p.stride[1]};
    attrs["padding"] = std::vector<int64_t>{p.padding[0], p.padding[1]};
    attrs["dilation"] = std::vector<int64_t>{p.dilation[0], p.dilation[1]};
    attrs["groups"] = p.groups;
    nhwc_[static_cast<size_t>(y.id)] =
        rw_.emit(ops::kConvNhwc, node.name, inputs, attrs, y.dtype, permuted(y.shape, kToNhwc));
  }

  void pool(const ir::Node& node) {
    for (size_t i = 1; i < node.outputs.size(); ++i)
      if (is_used(g_, consumers_, node.outputs[i]))
        throw CompileError("node '" + node.name + "': max_pool2d indices are used; Kiln does not compute them");
    const ir::Value& y = old(node.outputs.at(0));
    nhwc_[static_cast<size_t>(y.id)] = rw_.emit(ops::nhwc_pool_op(node.op), node.name, {as_nhwc(node.inputs.at(0))},
                                                node.attrs, y.dtype, permuted(y.shape, kToNhwc));
  }

  bool try_permute(const ir::Node& node) {
    if (!ops::is_constant_permute_op(node.op) || node.inputs.size() != 1 || node.outputs.size() != 1) return false;
    const int in = node.inputs[0], out = node.outputs[0];
    if (old(in).shape.size() != 4 || old(in).is_constant) return false;
    const std::vector<int64_t> perm = ops::permutation_of(node, 4);
    if (perm == kToNhwc && nhwc_[static_cast<size_t>(in)] >= 0) {
      nchw_[static_cast<size_t>(out)] = nhwc_[static_cast<size_t>(in)];
      return true;
    }
    if (perm == kToNchw && nchw_[static_cast<size_t>(in)] >= 0) {
      nhwc_[static_cast<size_t>(out)] = nchw_[static_cast<size_t>(in)];
      return true;
    }
    return false;
  }

  // A norm of a value that is channels-last only runs on the NHWC tensor
  // (unless its rows would be strided there, see norm_prefers_nhwc).
  bool try_norm(const ir::Node& node) {
    if (!ops::is_norm_op(node.op) || node.inputs.empty()) return false;
    const int in = node.inputs[0];
    if (old(in).shape.size() != 4 || nhwc_[static_cast<size_t>(in)] < 0 || nchw_[static_cast<size_t>(in)] >= 0 ||
        !ops::norm_prefers_nhwc(node))
      return false;
    for (size_t i = 1; i < node.outputs.size(); ++i)
      if (is_used(g_, consumers_, node.outputs[i])) return false;  // fusion names the problem
    std::vector<int> inputs = {nhwc_[static_cast<size_t>(in)]};
    for (size_t i = 1; i < node.inputs.size(); ++i) inputs.push_back(as_nchw(node.inputs[i]));
    const ir::Value& y = old(node.outputs[0]);
    nhwc_[static_cast<size_t>(y.id)] =
        rw_.emit(ops::nhwc_norm_op(node.op), node.name, inputs, node.attrs, y.dtype, permuted(y.shape, kToNhwc));
    return true;
  }

  bool try_pointwise(const ir::Node& node) {
    const ops::OpDef* p = ops::find_op(node.op);
    if (!p || p->role != ops::OpRole::kElementwise || node.outputs.size() != 1) return false;
    const ir::Value& y = old(node.outputs[0]);
    if (y.shape.size() != 4) return false;
    bool any_nhwc = false;
    for (int in : node.inputs) any_nhwc |= nhwc_[static_cast<size_t>(in)] >= 0 && nchw_[static_cast<size_t>(in)] < 0;
    if (!any_nhwc) return false;
    std::vector<int> inputs;
    for (int in : node.inputs) {
      const ir::Value& v = old(in);
      if (v.numel() == 1) continue;  // scalars broadcast in any layout
      if (v.shape.size() < 4) {  // right-aligned broadcast: pad to rank 4, then permute
        if (nchw_[static_cast<size_t>(in)] < 0) return false;
        std::vector<int64_t> padded(4 - v.shape.size(), 1);
        padded.insert(padded.end(), v.shape.begin(), v.shape.end());
        if (!v.is_constant && !moves_only_unit_dims(padded, kToNhwc)) return false;
        continue;
      }
      if (!cheap_nhwc(in)) return false;
    }
    for (int in : node.inputs) {
      const ir::Value& v = old(in);
      if (v.numel() == 1) continue;
      if (v.shape.size() < 4) {
        std::vector<int64_t> padded(4 - v.shape.size(), 1);
        padded.insert(padded.end(), v.shape.begin(), v.shape.end());
        std::vector<int64_t> shape = permuted(padded, kToNhwc);
        int id;
        if (v.is_constant) {
          ir::Value tmp = v;
          tmp.shape = padded;
          id = rw_.add_constant(v.name + "_nhwc", v.dtype, shape, permute_constant_data(tmp, kToNhwc));
        } else {
          id = rw_.emit("aten.view_copy.default", v.name + "_nhwc", {nchw_[static_cast<size_t>(in)]},
                        {{"size", shape}}, v.dtype, shape);
        }
        nhwc_small_[in] = id;
      }
    }
    for (int in : node.inputs) {
      const ir::Value& v = old(in);
      if (v.numel() == 1)
        inputs.push_back(nchw_[static_cast<size_t>(in)] >= 0 ? nchw_[static_cast<size_t>(in)] : as_nhwc(in));
      else if (v.shape.size() < 4)
        inputs.push_back(nhwc_small_.at(in));
      else
        inputs.push_back(as_nhwc(in));
    }
    nhwc_[static_cast<size_t>(y.id)] =
        rw_.emit(node.op, node.name, inputs, node.attrs, y.dtype, permuted(y.shape, kToNhwc));
    return true;
  }

  bool try_reduce(const ir::Node& node) {
    if (!is_reduce_with_dims(node.op) || node.inputs.size() != 1 || node.outputs.size() != 1) return false;
    int in = node.inputs[0];
    if (nhwc_[static_cast<size_t>(in)] < 0 || nchw_[static_cast<size_t>(in)] >= 0) return false;
    if (old(in).shape.size() != 4 || !node.has_attr("dim")) return false;
    std::vector<int64_t> dims = node.ints_attr("dim");
    if (dims.empty()) return false;
    std::vector<int64_t> inverse(4);  // NCHW dim -> NHWC position
    for (int64_t j = 0; j < 4; ++j) inverse[static_cast<size_t>(kToNhwc[static_cast<size_t>(j)])] = j;
    std::vector<bool> reduced(4, false);
    std::vector<int64_t> mapped;
    for (int64_t d : dims) {
      if (d < -4 || d >= 4) return false;
      if (d < 0) d += 4;
      reduced[static_cast<size_t>(d)] = true;
      mapped.push_back(inverse[static_cast<size_t>(d)]);
    }
    std::sort(mapped.begin(), mapped.end());
    std::map<std::string, ir::Attr> attrs = node.attrs;
    attrs["dim"] = mapped;
    const ir::Value& y = old(node.outputs[0]);
    bool keepdim = node.int_attr("keepdim", 0) != 0;
    if (keepdim) {
      nhwc_[static_cast<size_t>(y.id)] =
          rw_.emit(node.op, node.name, {nhwc_[static_cast<size_t>(in)]}, attrs, y.dtype, permuted(y.shape, kToNhwc));
      return true;
    }
    // Without keepdim the kept dims come out in NHWC order; fine when that is
    // their NCHW order too (e.g. reducing h and w leaves [n, c]).
    int64_t last = -1;
    for (int64_t j = 0; j < 4; ++j) {
      int64_t d = kToNhwc[static_cast<size_t>(j)];
      if (reduced[static_cast<size_t>(d)]) continue;
      if (d < last) return false;
      last = d;
    }
    nchw_[static_cast<size_t>(y.id)] =
        rw_.emit(node.op, node.name, {nhwc_[static_cast<size_t>(in)]}, attrs, y.dtype, y.shape);
    return true;
  }

  const ir::Graph& g_;
  GraphRewriter rw_;
  std::vector<std::vector<int>> consumers_;
  std::vector<int> nhwc_;  // old value -> new value holding it channels-last (-1: none yet)
  std::vector<int> nchw_;  // old value -> new value holding it in its own layout
  std::map<int, int> nhwc_small_;  // lower-rank broadcast operands, padded and permuted
};

}  // namespace

ir::Graph to_channels_last(const ir::Graph& graph) {
  bool any = false;
  for (const ir::Node& node : graph.nodes()) any |= ops::is_conv_op(node.op) || ops::is_pool_op(node.op);
  if (!any) return graph;
  return ChannelsLast(graph).run();
}

}  // namespace kiln::passes
