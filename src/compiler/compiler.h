// The engine compiler's entry points: which ops it takes (the op registry,
// ops/op_registry.h, asked through check_support: the one source of truth
// the Python partitioner uses) and graph -> serialized engine through the
// named pass pipeline (pass_names()) -> lowering -> serialization.
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
#include "ops/op_options.h"
#include "ops/op_query.h"

namespace kiln::compiler {

struct CompileOptions {
  // SMs to build cubins for: by default every SM NVRTC 13 builds for from
  // Ampere on (python/kiln/_options.py DEFAULT_TARGET_SMS is the same list).
  // PTX is added for the oldest one, so GPUs without a cubin here JIT it.
  std::vector<uint32_t> target_sms = {80, 86, 87, 89, 90, 100, 110, 120};
  // The SMs that get a cubin; empty: one for each of target_sms. Otherwise
  // each must be one of target_sms, and every target SM must have a cubin
  // of its major and the same or an older minor: CUDA runs sm_X.y machine
  // code on sm_X.z for z >= y, and the runtime picks it
  // (runtime/steps/kernel_code_choice.h). kiln.compile's default targets
  // get {80, 90, 100, 110, 120} (one per major: the sm_80 cubin serves
  // sm_86/87/89), which saves three of eight ptxas runs per module. The
  // engine's target_sms metadata still lists every SM covered.
  std::vector<uint32_t> cubin_sms;
  bool emit_ptx = true;
  // Dtypes the engine may compute in. A float32 graph with float16 (or
  // bfloat16) enabled computes in that dtype internally and casts at the
  // engine edges; inputs and outputs keep the graph's dtypes.
  std::vector<engine::DType> enabled_precisions = {engine::DType::kFloat32};
  // Baked into the engine's metadata (-1: no choice baked, 0: off, 1: on).
  int use_cuda_graphs = -1;
  // Programmatic dependent launch (codegen/grid_dependency.h): the cubins
  // for sm_90 and newer wait for their predecessor in-kernel, and the
  // runtime launches them while the previous kernel still runs, hiding
  // launch latency. Recorded in the metadata (overlap_launches), which the
  // runtime reads; false builds and launches kernels the classic way.
  bool overlap_launches = true;
  // How ops are planned (1x1 convs as GEMMs, depthwise kernels); recorded
  // in the engine metadata.
  ops::OpOptions op_options;
  // When not empty: the IR (and, after fusion, the step plan) is written to
  // <debug_dir>/<NN>_<pass>.txt after every pass, and the lowered steps to
  // <debug_dir>/<NN>_lower.txt. The folder is created if needed.
  std::string debug_dir;
  // Called with a one-line progress message (per phase and per kernel).
  std::function<void(const std::string&)> progress;
  // When not empty, compile_graph names the weights with this key prefix
  // (engine::externalize_weights) and leaves their bytes out of the engine;
  // its `weights` argument, when given, receives them (the front end hands
  // them to ExecuTorch's named data without parsing the engine again).
  std::string weights_named_as;
};

// The passes compile_to_desc runs, in order (the names used in debug dumps).
std::vector<std::string> pass_names();

// Describes one node to the capability query, without building a graph.
using ops::OpQuery;
using ops::TensorInfo;

// nullopt when the compiler takes the node; otherwise the reason it does not.
std::optional<std::string> check_support(const OpQuery& query);

// The ATen op names the compiler knows: every op in the registry that a
// partition may contain (internal kiln.* ops excluded). A node may still be
// refused by check_support for its dtypes, shapes or attributes.
std::vector<std::string> supported_ops();

// Multi-output ops of which the compiler computes output 0 only, each with
// the reason it cannot take a node whose later outputs are used (the
// partitioner refuses those nodes; OpDef::first_output_only).
std::map<std::string, std::string> first_output_only_ops();

// Ops whose node is a constant at compile time whenever its input is one
// (views and permutes, folded by passes/fold_constants.cpp): the
// partitioner counts a weight reached through them as constant.
std::vector<std::string> constant_view_ops();

// Compiles `graph` into an engine. Throws CompileError.
engine::EngineDesc compile_to_desc(const ir::Graph& graph, const CompileOptions& options);

// compile_to_desc + serialize_engine; with CompileOptions::weights_named_as,
// `weights` (when given) receives the weights that left the engine.
std::vector<uint8_t> compile_graph(const ir::Graph& graph, const CompileOptions& options,
                                   std::vector<engine::ExternalWeight>* weights = nullptr);

}  // namespace kiln::compiler
