// Splits as slices (passes.h splits_to_slices): one slice node per piece of a split, so that each
// piece's readers can read it in place like any slice instead of a layout kernel per piece.
#include <string>

#include "passes/graph_rewriter.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// A split this pass rewrites: of a computed tensor (splits of constants are fold_constants').
bool slices_here(const ir::Graph& graph, const ir::Node& n) {
  return (n.op == "aten.split_with_sizes_copy.default" || n.op == "aten.split_copy.Tensor") && n.inputs.size() == 1 &&
         !graph.value(n.inputs[0]).is_constant;
}

}  // namespace

ir::Graph splits_to_slices(const ir::Graph& graph) {
  bool any = false;
  for (const ir::Node& n : graph.nodes())
    any |= slices_here(graph, n);
  if (!any) return graph;
  GraphRewriter rw(graph);
  for (const ir::Node& n : graph.nodes()) {
    if (folded_to_constants(graph, n)) continue;
    std::vector<int> inputs;
    for (int id : n.inputs) inputs.push_back(rw.map(id));
    if (!slices_here(graph, n)) {
      rw.copy_node(n, std::move(inputs));
      continue;
    }
    const ir::Value& in = graph.value(n.inputs[0]);
    const int64_t rank = static_cast<int64_t>(in.shape.size());
    int64_t dim = n.int_attr("dim", 0);
    if (dim < 0) dim += rank;
    if (dim < 0 || dim >= rank) throw CompileError("node '" + n.name + "': split dim out of range");
    int64_t start = 0;
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const ir::Value& out = graph.value(n.outputs[i]);
      const int64_t size = out.shape.at(static_cast<size_t>(dim));
      const int id = rw.emit("aten.slice_copy.Tensor", n.name + "_" + std::to_string(i), {inputs[0]},
                             {{"dim", dim}, {"start", start}, {"end", start + size}, {"step", int64_t{1}}}, out.dtype,
                             out.shape);
      rw.set_map(n.outputs[i], id);
      start += size;
    }
    if (start != in.shape[static_cast<size_t>(dim)])
      throw CompileError("node '" + n.name + "': split sizes do not add up to the input along dim " +
                         std::to_string(dim));
  }
  return rw.finish();
}

}  // namespace kiln::passes
