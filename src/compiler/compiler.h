// The engine compiler's entry points: which ops it takes (the one source of
// truth the Python partitioner asks) and graph -> serialized engine.
// Phases: verify -> precision -> fuse -> plan memory -> lower -> serialize.
//
// Compiler code: throws kiln::CompileError with a message naming the node.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine_format/engine_desc.h"
#include "ir/graph.h"

namespace kiln::compiler {

struct CompileOptions {
  // SMs to build cubins for; PTX is added for the newest one so newer GPUs can
  // JIT it.
  std::vector<uint32_t> target_sms = {87, 90};
  bool emit_ptx = true;
  // Dtypes the engine may compute in. A float32 graph with float16 (or
  // bfloat16) enabled computes in that dtype internally and casts at the
  // engine edges; inputs and outputs keep the graph's dtypes.
  std::vector<engine::DType> enabled_precisions = {engine::DType::kFloat32};
  // Baked into the engine's metadata (-1: no choice baked, 0: off, 1: on).
  int use_cuda_graphs = -1;
  // Called with a one-line progress message (per phase and per kernel).
  std::function<void(const std::string&)> progress;
};

// Describes one node to the capability query, without building a graph.
struct TensorInfo {
  engine::DType dtype = engine::DType::kFloat32;
  std::vector<int64_t> shape;
  bool is_constant = false;  // a parameter, buffer or lifted constant
};

struct OpQuery {
  std::string op;
  std::vector<TensorInfo> inputs;  // tensor arguments, in schema order
  std::map<std::string, ir::Attr> attrs;
  std::vector<TensorInfo> outputs;
};

// nullopt when the compiler takes the node; otherwise the reason it does not.
std::optional<std::string> check_support(const OpQuery& query);

// The ATen op names the compiler knows (a node may still be refused by
// check_support for its dtypes, shapes or attributes).
std::vector<std::string> supported_ops();

// Compiles `graph` into an engine. Throws CompileError.
engine::EngineDesc compile_to_desc(const ir::Graph& graph, const CompileOptions& options);

// compile_to_desc + serialize_engine.
std::vector<uint8_t> compile_graph(const ir::Graph& graph, const CompileOptions& options);

}  // namespace kiln::compiler
