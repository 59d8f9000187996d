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
//
// 1-D stacks: a 3-D value [n, c, l] counts as [n, c, 1, l], so its
// channels-last form is the 4-D [n, 1, l, c]. A 1-D convolution becomes the
// 2-D kiln.conv2d_nhwc of height 1 (weight [k, 1, r, c/groups]), so cuDNN,
// the 1x1 GEMMs, the depthwise kernels and the epilogue fusion all apply;
// the unsqueeze/squeeze pair around 2-D pooling (how F.max_pool1d and friends
// export) carries the channels-last form through unchanged. Transposed
// convolutions (1-D and 2-D) become kiln.conv_transpose2d_nhwc with their
// weight permuted to [r, s, c, k/groups].
#include <algorithm>

#include "ops/conv_ops.h"
#include "ops/conv_transpose_ops.h"
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

// A 3-D value [n, c, l] is handled as [n, c, 1, l].
std::vector<int64_t> as_4d(const std::vector<int64_t>& shape) {
  if (shape.size() == 3) return {shape[0], shape[1], 1, shape[2]};
  return shape;
}

// Reshapes that may carry a channels-last form: [n, c, l] <-> [n, c, 1, l].
bool is_reshape(const std::string& op) {
  return op == "aten.view_copy.default" || op == "aten.unsqueeze_copy.default" ||
         op == "aten.squeeze_copy.dims" || op == "aten.squeeze_copy.dim" || op == "aten.squeeze_copy.default" ||
         op == "aten.view.default" || op == "aten.reshape.default" || op == "aten._unsafe_view.default";
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
      } else if (!try_unit_reshape(node) && !try_permute(node) && !try_norm(node) && !try_pointwise(node) &&
                 !try_reduce(node)) {
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
    const ir::Value& v = old(id);
    int id4 = relayout(src, kToNchw, v.name + "_nchw");
    if (v.shape.size() == 3)  // [n, c, 1, l] -> [n, c, l]
      id4 = rw_.emit("aten.view_copy.default", v.name + "_ncl", {id4}, {{"size", v.shape}}, v.dtype, v.shape);
    nchw_[static_cast<size_t>(id)] = id4;
    return id4;
  }

  // The NHWC form of a 4-D value (of [n, c, 1, l] for a 3-D one), made if
  // needed (constants permute at export, unit-dim permutes are views, others
  // cost a layout kernel).
  int as_nhwc(int id) {
    if (nhwc_[static_cast<size_t>(id)] >= 0) return nhwc_[static_cast<size_t>(id)];
    const ir::Value& v = old(id);
    const std::vector<int64_t> shape4 = as_4d(v.shape);
    int made;
    if (v.is_constant) {
      ir::Value tmp = v;
      tmp.shape = shape4;
      made = rw_.add_constant(v.name + "_nhwc", v.dtype, permuted(shape4, kToNhwc), permute_constant_data(tmp, kToNhwc));
    } else {
      int src = as_nchw(id);
      if (v.shape.size() == 3)
        src = rw_.emit("aten.view_copy.default", v.name + "_nc1l", {src}, {{"size", shape4}}, v.dtype, shape4);
      made = relayout(src, kToNhwc, v.name + "_nhwc");
    }
    nhwc_[static_cast<size_t>(id)] = made;
    return made;
  }

  // Whether `id` has an NHWC form without a layout kernel.
  bool cheap_nhwc(int id) const {
    const ir::Value& v = old(id);
    if (v.shape.size() != 4 && v.shape.size() != 3) return false;
    return nhwc_[static_cast<size_t>(id)] >= 0 || v.is_constant || moves_only_unit_dims(as_4d(v.shape), kToNhwc);
  }

  int relayout(int new_id, const std::vector<int64_t>& perm, const std::string& name) {
    const ir::Value& v = rw_.out().value(new_id);
    std::vector<int64_t> shape = permuted(v.shape, perm);
    if (moves_only_unit_dims(v.shape, perm))
      return rw_.emit("aten.view_copy.default", name, {new_id}, {{"size", shape}}, v.dtype, shape);
    return rw_.emit("aten.permute_copy.default", name, {new_id}, {{"dims", perm}}, v.dtype, shape);
  }

  void conv(const ir::Node& node) {
    const ir::Value& x = old(node.inputs.at(0));
    const ir::Value& w = old(node.inputs.at(1));
    const ir::Value& y = old(node.outputs.at(0));
    const size_t rank = x.shape.size();
    if ((rank != 3 && rank != 4) || w.shape.size() != rank || !w.is_constant || y.shape.size() != rank)
      throw CompileError("node '" + node.name + "': only 1-D and 2-D convolutions with constant weights are supported");
    ops::ConvParams p = ops::conv_params(node);
    if (rank == 3) {  // the width's values; height 1, unpadded
      p.stride = {1, p.stride[1]};
      p.padding = {0, p.padding[1]};
      p.dilation = {1, p.dilation[1]};
      p.output_padding = {0, p.output_padding[1]};
    }
    std::vector<int> inputs = {as_nhwc(x.id)};
    if (p.transposed) {
      // [c, k/groups, r, s] -> [r, s, c, k/groups]
      ir::Value tmp = w;
      tmp.shape = as_4d(w.shape);
      const std::vector<int64_t> perm = {2, 3, 0, 1};
      inputs.push_back(rw_.add_constant(w.name + "_rsck", w.dtype, permuted(tmp.shape, perm),
                                        permute_constant_data(tmp, perm)));
    } else {
      inputs.push_back(as_nhwc(w.id));  // OHWI
    }
    if (node.inputs.size() > 2) inputs.push_back(rw_.map(node.inputs[2]));
    std::map<std::string, ir::Attr> attrs;
    attrs["stride"] = std::vector<int64_t>{p.stride[0], p.stride[1]};
    attrs["padding"] = std::vector<int64_t>{p.padding[0], p.padding[1]};
    attrs["dilation"] = std::vector<int64_t>{p.dilation[0], p.dilation[1]};
    attrs["groups"] = p.groups;
    if (p.transposed) attrs["output_padding"] = std::vector<int64_t>{p.output_padding[0], p.output_padding[1]};
    nhwc_[static_cast<size_t>(y.id)] = rw_.emit(p.transposed ? ops::kConvTransposeNhwc : ops::kConvNhwc, node.name,
                                                inputs, attrs, y.dtype, permuted(as_4d(y.shape), kToNhwc));
  }

  // [n, c, l] <-> [n, c, 1, l] reshapes share one channels-last form, so a
  // 1-D pooling (unsqueeze, 2-D pooling, squeeze) or a squeeze after a
  // height-1 result needs no layout kernel. The reshape itself is kept only
  // when its input's own layout already exists (it is then free).
  bool try_unit_reshape(const ir::Node& node) {
    if (!is_reshape(node.op) || node.inputs.size() != 1 || node.outputs.size() != 1) return false;
    const int in = node.inputs[0];
    const ir::Value& x = old(in);
    const ir::Value& y = old(node.outputs[0]);
    if (nhwc_[static_cast<size_t>(in)] < 0 || x.dtype != y.dtype) return false;
    const bool up = x.shape.size() == 3 && y.shape == as_4d(x.shape);
    const bool down = y.shape.size() == 3 && x.shape == as_4d(y.shape);
    if (!up && !down) return false;
    if (nchw_[static_cast<size_t>(in)] >= 0) {
      rw_.copy_node(node, {nchw_[static_cast<size_t>(in)]});
      nchw_[static_cast<size_t>(y.id)] = rw_.map(y.id);
    }
    nhwc_[static_cast<size_t>(y.id)] = nhwc_[static_cast<size_t>(in)];
    return true;
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
    const size_t rank = y.shape.size();
    if (rank != 4 && rank != 3) return false;
    // A lower-rank operand broadcasts right-aligned: pad it to the output's
    // rank, then (3-D) to [n, c, 1, l].
    auto padded_4d = [rank](const std::vector<int64_t>& shape) {
      std::vector<int64_t> padded(rank - shape.size(), 1);
      padded.insert(padded.end(), shape.begin(), shape.end());
      return as_4d(padded);
    };
    bool any_nhwc = false;
    for (int in : node.inputs) any_nhwc |= nhwc_[static_cast<size_t>(in)] >= 0 && nchw_[static_cast<size_t>(in)] < 0;
    if (!any_nhwc) return false;
    std::vector<int> inputs;
    for (int in : node.inputs) {
      const ir::Value& v = old(in);
      if (v.numel() == 1) continue;  // scalars broadcast in any layout
      if (v.shape.size() < rank) {  // right-aligned broadcast: pad, then permute
        if (nchw_[static_cast<size_t>(in)] < 0) return false;
        if (!v.is_constant && !moves_only_unit_dims(padded_4d(v.shape), kToNhwc)) return false;
        continue;
      }
      if (v.shape.size() != rank || !cheap_nhwc(in)) return false;
    }
    for (int in : node.inputs) {
      const ir::Value& v = old(in);
      if (v.numel() == 1) continue;
      if (v.shape.size() < rank) {
        const std::vector<int64_t> padded = padded_4d(v.shape);
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
      else if (v.shape.size() < rank)
        inputs.push_back(nhwc_small_.at(in));
      else
        inputs.push_back(as_nhwc(in));
    }
    nhwc_[static_cast<size_t>(y.id)] =
        rw_.emit(node.op, node.name, inputs, node.attrs, y.dtype, permuted(as_4d(y.shape), kToNhwc));
    return true;
  }

  bool try_reduce(const ir::Node& node) {
    if (!is_reduce_with_dims(node.op) || node.inputs.size() != 1 || node.outputs.size() != 1) return false;
    int in = node.inputs[0];
    if (nhwc_[static_cast<size_t>(in)] < 0 || nchw_[static_cast<size_t>(in)] >= 0) return false;
    const int64_t rank = static_cast<int64_t>(old(in).shape.size());
    if ((rank != 4 && rank != 3) || !node.has_attr("dim")) return false;
    std::vector<int64_t> dims = node.ints_attr("dim");
    if (dims.empty()) return false;
    std::vector<int64_t> inverse(4);  // NCHW dim -> NHWC position
    for (int64_t j = 0; j < 4; ++j) inverse[static_cast<size_t>(kToNhwc[static_cast<size_t>(j)])] = j;
    std::vector<bool> reduced(4, false);  // over the 4-D (NCHW, or [n, c, 1, l]) dims
    for (int64_t d : dims) {
      if (d < -rank || d >= rank) return false;
      if (d < 0) d += rank;
      if (rank == 3 && d == 2) d = 3;  // l
      reduced[static_cast<size_t>(d)] = true;
    }
    const ir::Value& y = old(node.outputs[0]);
    bool keepdim = node.int_attr("keepdim", 0) != 0;
    if (rank == 3 && !keepdim) reduced[2] = true;  // the unit height goes too
    std::vector<int64_t> mapped;
    for (int64_t d = 0; d < 4; ++d)
      if (reduced[static_cast<size_t>(d)]) mapped.push_back(inverse[static_cast<size_t>(d)]);
    std::sort(mapped.begin(), mapped.end());
    std::map<std::string, ir::Attr> attrs = node.attrs;
    attrs["dim"] = mapped;
    if (keepdim) {
      nhwc_[static_cast<size_t>(y.id)] = rw_.emit(node.op, node.name, {nhwc_[static_cast<size_t>(in)]}, attrs, y.dtype,
                                                  permuted(as_4d(y.shape), kToNhwc));
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
