// Patch embeddings as GEMMs. A 2-D convolution whose kernel equals its stride
// (no padding, dilation 1, groups 1) reads every input element exactly once:
// its input cut into non-overlapping patches is a matrix, and the
// convolution is that matrix times the flattened weight. For x [n, c, h, w],
// kernel (kh, kw), p = h / kh, q = w / kw:
//   x -> permute [n, h, w, c]
//     -> view    [n, p, kh, q, kw, c]
//     -> permute [n, p, q, kh, kw, c]   (the one layout kernel)
//     -> view    [n, p, q, kh * kw * c]
//     -> linear with w permuted at export to [k_out, kh, kw, c], and the
//        bias: [n, p, q, k_out]
//     -> permute [n, k_out, p, q]       (NCHW again)
// The patch elements are ordered channels-last, so where the input already
// has a channels-last form (a conv stack, see channels_last.cpp) the first
// permute is free and the gather reads whole rows of kw * c elements, and
// the last permute is free for a consumer that reads channels-last; fusion
// folds the remaining permutes and views into one gather kernel (or none,
// see ops/layout_ops.cpp). A spatial extent that the kernel does not divide
// is sliced first (torch drops the leftover rows).
//
// Left to the convolution lowering: 1x1 kernels (the channels-last pass keeps
// them GEMMs inside stacks), and kernels of height 1 or as wide as the input,
// and 1-D convolutions: their patches can be the input's own element order
// (channels-last, or a transposed [n, l, c] tensor), so fusion would make the
// gather an alias and the GEMM would read a tensor whose stored dims do not
// split into its rows, which the engine format refuses (step_check.cpp).
// Like strided 1x1 convolutions this is conv_gemm "all" (the default): with
// "unstrided" or "none" these convolutions stay on cuDNN.
#include "ops/conv_ops.h"
#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

using Shape = std::vector<int64_t>;

// Whether the rewrite applies to `node` (see above).
bool is_patch_conv(const ir::Graph& graph, const ir::Node& node) {
  if (!ops::is_conv_op(node.op) || node.inputs.size() < 2 || node.inputs.size() > 3 || node.outputs.size() != 1)
    return false;
  const ir::Value& x = graph.value(node.inputs[0]);
  const ir::Value& w = graph.value(node.inputs[1]);
  const ir::Value& y = graph.value(node.outputs[0]);
  if (x.shape.size() != 4 || w.shape.size() != 4 || y.shape.size() != 4 || !w.is_constant) return false;
  if (w.dtype != x.dtype || y.dtype != x.dtype) return false;
  const int64_t k_out = w.shape[0];
  if (w.shape[1] != x.shape[1] || y.shape[0] != x.shape[0] || y.shape[1] != k_out) return false;
  if (node.inputs.size() == 3) {
    const ir::Value& b = graph.value(node.inputs[2]);
    if (b.shape != Shape{k_out} || b.dtype != x.dtype) return false;
  }
  ops::ConvParams p;
  try {
    p = ops::conv_params(node);
  } catch (const CompileError&) {
    return false;  // the convolution's own lowering names the problem
  }
  if (p.transposed || p.groups != 1) return false;
  for (size_t i = 0; i < 2; ++i) {
    const int64_t k = w.shape[2 + i];
    if (p.stride[i] != k || p.padding[i] != 0 || p.dilation[i] != 1) return false;
    if (x.shape[2 + i] < k || y.shape[2 + i] != x.shape[2 + i] / k) return false;
  }
  return w.shape[2] > 1 && y.shape[3] > 1;  // kh > 1, q > 1
}

}  // namespace

ir::Graph patchify_convolutions(const ir::Graph& graph, const ops::OpOptions& options) {
  if (options.conv_gemm != ops::OpOptions::ConvGemm::kAll) return graph;  // those convolutions stay on cuDNN
  bool any = false;
  for (const ir::Node& node : graph.nodes()) any |= node.op != "kiln.folded" && is_patch_conv(graph, node);
  if (!any) return graph;

  GraphRewriter rw(graph);
  for (const ir::Node& node : graph.nodes()) {
    if (node.op == "kiln.folded") continue;
    std::vector<int> inputs;
    for (int in : node.inputs) inputs.push_back(rw.map(in));
    if (!is_patch_conv(graph, node)) {
      rw.copy_node(node, inputs);
      continue;
    }
    const ir::Value& x = graph.value(node.inputs[0]);
    const ir::Value& w = graph.value(node.inputs[1]);
    const ir::Value& y = graph.value(node.outputs[0]);
    const engine::DType dt = x.dtype;
    const int64_t n = x.shape[0], c = x.shape[1], k_out = w.shape[0];
    const int64_t kh = w.shape[2], kw = w.shape[3], p = y.shape[2], q = y.shape[3];
    const std::string& name = node.name;

    // Leftover rows and columns the kernel does not reach.
    int v = inputs[0];
    Shape shape = x.shape;
    for (size_t i = 0; i < 2; ++i) {
      const int64_t used = y.shape[2 + i] * w.shape[2 + i];
      if (shape[2 + i] == used) continue;
      shape[2 + i] = used;
      v = rw.emit("aten.slice_copy.Tensor", name + (i == 0 ? "_crop_h" : "_crop_w"), {v},
                  {{"dim", static_cast<int64_t>(2 + i)}, {"start", int64_t{0}}, {"end", used}, {"step", int64_t{1}}},
                  dt, shape);
    }
    v = rw.emit("aten.permute_copy.default", name + "_nhwc", {v}, {{"dims", Shape{0, 2, 3, 1}}}, dt,
                {n, p * kh, q * kw, c});
    v = rw.emit("aten.view_copy.default", name + "_split", {v}, {{"size", Shape{n, p, kh, q, kw, c}}}, dt,
                {n, p, kh, q, kw, c});
    v = rw.emit("aten.permute_copy.default", name + "_patches", {v}, {{"dims", Shape{0, 1, 3, 2, 4, 5}}}, dt,
                {n, p, q, kh, kw, c});
    // The rows of patches; the linear's result is [n, p, q, k_out] with no
    // view between it and a ReLU after the convolution, which it absorbs.
    const int64_t cols = kh * kw * c;
    v = rw.emit("aten.view_copy.default", name + "_rows", {v}, {{"size", Shape{n, p, q, cols}}}, dt, {n, p, q, cols});
    const int wm = rw.add_constant(w.name + "_patch", w.dtype, {k_out, cols}, permute_constant_data(w, {0, 2, 3, 1}));
    std::vector<int> linear_in = {v, wm};
    if (inputs.size() == 3) linear_in.push_back(inputs[2]);
    v = rw.emit("aten.linear.default", name, linear_in, {}, dt, {n, p, q, k_out});
    v = rw.emit("aten.permute_copy.default", name + "_nchw", {v}, {{"dims", Shape{0, 3, 1, 2}}}, dt, y.shape);
    rw.set_map(y.id, v);
  }
  ir::Graph out = rw.finish();
  out.verify();
  return out;
}

}  // namespace kiln::passes
