// Precision: a float32 graph compiled with float16 (or bfloat16) enabled
// computes in the lower precision inside the engine, keeping the graph's
// input and output dtypes at its edges (casts fuse into the neighbouring
// elementwise kernels; GEMMs and convolutions read compute-dtype operands,
// their weights converted at export like every float constant).
#include <algorithm>

#include "ops/conv_ops.h"
#include "ops/gemm_ops.h"
#include "ops/view_ops.h"
#include "passes/dtype_convert.h"
#include "passes/passes.h"

namespace kiln::passes {

engine::DType choose_compute_dtype(const std::vector<engine::DType>& enabled) {
  auto has = [&](engine::DType d) { return std::find(enabled.begin(), enabled.end(), d) != enabled.end(); };
  if (has(engine::DType::kFloat16)) return engine::DType::kFloat16;
  if (has(engine::DType::kBFloat16)) return engine::DType::kBFloat16;
  return engine::DType::kFloat32;
}

ir::Graph apply_precision(const ir::Graph& graph, engine::DType compute) {
  if (compute == engine::DType::kFloat32) return graph;
  auto lowered = [&](engine::DType d) { return d == engine::DType::kFloat32 ? compute : d; };

  ir::Graph out;
  std::vector<int> map(graph.values().size(), -1);
  // Graph inputs keep their dtype; a cast to the compute dtype is made lazily
  // for consumers that cannot convert on load (matrix products).
  std::vector<int> cast_of(graph.values().size(), -1);
  for (int id : graph.inputs()) {
    const ir::Value& v = graph.value(id);
    map[static_cast<size_t>(id)] = out.add_input(v.name, v.dtype, v.shape);
  }
  // States keep their dtype (their storage outlives the engine); an update
  // of another dtype fails the graph's verify, and the partition stays on the CPU.
  for (const ir::State& s : graph.states()) {
    const ir::Value& v = graph.value(s.value);
    map[static_cast<size_t>(s.value)] = out.add_state(v.name, v.dtype, v.shape, s.key, v.data);
  }
  for (const ir::Value& v : graph.values()) {
    if (!v.is_constant) continue;
    engine::DType d = lowered(v.dtype);
    map[static_cast<size_t>(v.id)] = out.add_constant(v.name, d, v.shape, convert_float_data(v.data, v.dtype, d));
  }
  auto cast_input = [&](int old_id) {
    int& cached = cast_of[static_cast<size_t>(old_id)];
    if (cached < 0) {
      const ir::Value& v = graph.value(old_id);
      int node = out.add_node("kiln.cast", v.name + "_to_" + engine::dtype_name(compute),
                              {map[static_cast<size_t>(old_id)]}, {}, {{compute, v.shape}});
      cached = out.nodes()[static_cast<size_t>(node)].outputs[0];
    }
    return cached;
  };
  std::vector<bool> is_graph_input(graph.values().size(), false);
  for (int id : graph.inputs()) is_graph_input[static_cast<size_t>(id)] = true;

  for (const ir::Node& node : graph.nodes()) {
    if (node.op == "kiln.folded") continue;
    // Views alias their input, so a view of a graph input must see the
    // compute dtype too.
    bool needs_compute_operands =
        ops::is_gemm_op(node.op) || node.op == ops::kConvNhwc || ops::is_view_op(node.op);
    std::vector<int> inputs;
    for (int in : node.inputs) {
      const ir::Value& v = graph.value(in);
      bool cast = needs_compute_operands && is_graph_input[static_cast<size_t>(in)] && v.dtype != lowered(v.dtype);
      inputs.push_back(cast ? cast_input(in) : map[static_cast<size_t>(in)]);
    }
    std::vector<std::pair<engine::DType, std::vector<int64_t>>> types;
    for (int o : node.outputs) types.emplace_back(lowered(graph.value(o).dtype), graph.value(o).shape);
    int index = out.add_node(node.op, node.name, inputs, node.attrs, types);
    for (size_t i = 0; i < node.outputs.size(); ++i)
      map[static_cast<size_t>(node.outputs[i])] = out.nodes()[static_cast<size_t>(index)].outputs[i];
  }

  std::vector<int> outputs;
  for (int id : graph.outputs()) {
    const ir::Value& v = graph.value(id);
    int mapped = map[static_cast<size_t>(id)];
    if (out.value(mapped).dtype != v.dtype) {
      int node = out.add_node("kiln.cast", v.name + "_to_" + engine::dtype_name(v.dtype), {mapped}, {},
                              {{v.dtype, v.shape}});
      mapped = out.nodes()[static_cast<size_t>(node)].outputs[0];
    }
    outputs.push_back(mapped);
  }
  out.set_outputs(outputs);
  for (const ir::State& s : graph.states())
    if (s.update >= 0) out.set_state_update(map[static_cast<size_t>(s.value)], map[static_cast<size_t>(s.update)]);
  out.verify();
  return out;
}

}  // namespace kiln::passes
