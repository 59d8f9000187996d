// Batch norm (inference) at export time. Where its input is a convolution
// with constant weights whose only use is the batch norm, the normalization
// folds into that convolution's weight and bias (computed in double from the
// original dtype, before precision lowers the constants):
//   scale = gamma / sqrt(var + eps)
//   w'[k] = w[k] * scale[k],   b'[k] = (b[k] - mean[k]) * scale[k] + beta[k]
// (a transposed convolution's weight is [c, k/groups, ...]: its output
// channel is the group's k/groups block and the weight's second index).
// Any other batch norm becomes x * scale + shift with per-channel constants
// shaped [c, 1, ..., 1], which broadcast like the op does.
#include <cmath>
#include <cstring>

#include "ops/conv_ops.h"
#include "passes/dtype_convert.h"
#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

std::vector<double> to_doubles(const ir::Value& v) {
  std::vector<uint8_t> f32 = convert_float_data(v.data, v.dtype, engine::DType::kFloat32);
  std::vector<double> out(static_cast<size_t>(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    float f;
    std::memcpy(&f, f32.data() + i * 4, 4);
    out[i] = f;
  }
  return out;
}

std::vector<uint8_t> from_doubles(const std::vector<double>& values, engine::DType dtype) {
  std::vector<uint8_t> f32(values.size() * 4);
  for (size_t i = 0; i < values.size(); ++i) {
    float f = static_cast<float>(values[i]);
    std::memcpy(f32.data() + i * 4, &f, 4);
  }
  return convert_float_data(f32, engine::DType::kFloat32, dtype);
}

struct BnScale {
  std::vector<double> scale, shift;  // y = x * scale + shift
};

BnScale bn_scale(const ir::Graph& g, const ir::Node& bn) {
  if (bn.inputs.size() != 5)
    throw CompileError("node '" + bn.name + "': batch norm without an affine weight and bias is not supported");
  for (size_t i = 1; i < 5; ++i)
    if (!g.value(bn.inputs[i]).is_constant)
      throw CompileError("node '" + bn.name + "': batch norm parameters must be constant");
  std::vector<double> gamma = to_doubles(g.value(bn.inputs[1])), beta = to_doubles(g.value(bn.inputs[2]));
  std::vector<double> mean = to_doubles(g.value(bn.inputs[3])), var = to_doubles(g.value(bn.inputs[4]));
  double eps = bn.float_attr("eps", 1e-5);
  BnScale s;
  for (size_t c = 0; c < gamma.size(); ++c) {
    double scale = gamma[c] / std::sqrt(var.at(c) + eps);
    s.scale.push_back(scale);
    s.shift.push_back(beta.at(c) - mean.at(c) * scale);
  }
  return s;
}

}  // namespace

ir::Graph fold_batch_norm(const ir::Graph& graph) {
  bool any = false;
  for (const ir::Node& node : graph.nodes()) any |= ops::is_batch_norm_op(node.op);
  if (!any) return graph;

  auto consumers = consumers_of(graph);
  GraphRewriter rw(graph);
  std::vector<bool> folded(graph.nodes().size(), false);  // batch norms merged into their conv
  for (size_t n = 0; n < graph.nodes().size(); ++n) {
    const ir::Node& node = graph.nodes()[n];
    if (node.op == "kiln.folded" || folded[n]) continue;
    std::vector<int> inputs;
    for (int in : node.inputs) inputs.push_back(rw.map(in));

    if (ops::is_batch_norm_op(node.op)) {
      for (size_t i = 1; i < node.outputs.size(); ++i)
        if (is_used(graph, consumers, node.outputs[i]))
          throw CompileError("node '" + node.name + "': batch norm's saved statistics are used; Kiln computes only its output");
      BnScale s = bn_scale(graph, node);
      const ir::Value& x = graph.value(node.inputs[0]);
      std::vector<int64_t> shape(x.shape.size() - 1, 1);
      shape[0] = x.shape.at(1);
      int scale = rw.add_constant(node.name + "_scale", x.dtype, shape, from_doubles(s.scale, x.dtype));
      int shift = rw.add_constant(node.name + "_shift", x.dtype, shape, from_doubles(s.shift, x.dtype));
      int y = rw.emit("aten.mul.Tensor", node.name + "_mul", {inputs[0], scale}, {}, x.dtype, x.shape);
      y = rw.emit("aten.add.Tensor", node.name, {y, shift}, {}, x.dtype, x.shape);
      rw.set_map(node.outputs[0], y);
      continue;
    }

    if (ops::is_conv_op(node.op) && node.inputs.size() >= 2 && graph.value(node.inputs[1]).is_constant &&
        (node.inputs.size() == 2 || graph.value(node.inputs[2]).is_constant)) {
      int out = node.outputs[0];
      const auto& users = consumers[static_cast<size_t>(out)];
      bool is_output = false;
      for (int o : graph.outputs()) is_output |= o == out;
      if (!is_output && users.size() == 1) {
        const ir::Node& bn = graph.nodes()[static_cast<size_t>(users[0])];
        bool stats_unused = true;
        for (size_t i = 1; i < bn.outputs.size(); ++i) stats_unused &= !is_used(graph, consumers, bn.outputs[i]);
        if (ops::is_batch_norm_op(bn.op) && bn.inputs[0] == out && stats_unused && bn.inputs.size() == 5) {
          bool params_constant = true;
          for (size_t i = 1; i < 5; ++i) params_constant &= graph.value(bn.inputs[i]).is_constant;
          if (params_constant) {
            BnScale s = bn_scale(graph, bn);
            const ir::Value& w = graph.value(node.inputs[1]);
            std::vector<double> wd = to_doubles(w);
            // w is [k, c/groups, ...], or transposed [c, k/groups, ...]:
            // output channel (i / (c/groups)) * (k/groups) + j of w[i, j].
            const ops::ConvParams params = ops::conv_params(node);
            const int64_t groups = params.transposed ? params.groups : 1;
            const int64_t rows = w.shape[0], cols = params.transposed ? w.shape[1] : 1;
            const int64_t k = params.transposed ? cols * groups : rows;
            if (static_cast<int64_t>(s.scale.size()) != k || rows % groups != 0)
              throw CompileError("node '" + bn.name + "': batch norm channels do not match convolution '" +
                                 node.name + "'");
            const int64_t per = w.numel() / (rows * cols), rows_per_group = rows / groups;
            for (int64_t i = 0; i < rows; ++i)
              for (int64_t j = 0; j < cols; ++j) {
                const int64_t channel = params.transposed ? (i / rows_per_group) * cols + j : i;
                const double f = s.scale[static_cast<size_t>(channel)];
                for (int64_t e = 0; e < per; ++e) wd[static_cast<size_t>((i * cols + j) * per + e)] *= f;
              }
            std::vector<double> bias(static_cast<size_t>(k), 0.0);
            if (node.inputs.size() == 3) bias = to_doubles(graph.value(node.inputs[2]));
            for (int64_t o = 0; o < k; ++o) {
              size_t c = static_cast<size_t>(o);
              bias[c] = bias[c] * s.scale[c] + s.shift[c];
            }
            int nw = rw.add_constant(w.name + "_bn", w.dtype, w.shape, from_doubles(wd, w.dtype));
            int nb = rw.add_constant(bn.name + "_bias", w.dtype, {k}, from_doubles(bias, w.dtype));
            const ir::Value& y = graph.value(out);
            int v = rw.emit(node.op, node.name + "+" + bn.name, {inputs[0], nw, nb}, node.attrs, y.dtype, y.shape);
            rw.set_map(out, v);
            rw.set_map(bn.outputs[0], v);
            folded[static_cast<size_t>(users[0])] = true;
            continue;
          }
        }
      }
    }
    rw.copy_node(node, inputs);
  }
  ir::Graph out = rw.finish();
  out.verify();
  return out;
}

}  // namespace kiln::passes
