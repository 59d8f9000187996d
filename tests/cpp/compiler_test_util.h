// Graph builders and engine queries shared by the compiler tests.
#pragma once

#include <random>

#include "engine_format/engine_desc.h"
#include "ir/graph.h"
#include "ops/step_plan.h"

namespace kiln::testing {

std::vector<uint8_t> random_float_bytes(size_t count, std::mt19937& rng);

// x[batch, in] -> Linear(in, hidden) -> GELU -> Linear(hidden, hidden) -> ReLU
// -> Linear(hidden, out), in the edge dialect's decomposed form
// (permute_copy of the weight + addmm).
ir::Graph make_mlp_graph(int64_t batch, int64_t in, int64_t hidden, int64_t out, std::mt19937& rng);

// Steps of an engine of one kind, or with one label.
size_t count_kind(const engine::EngineDesc& d, engine::StepKind kind);
size_t count_label(const engine::EngineDesc& d, const std::string& label);

// How many times `what` occurs in `text` (a marker in generated source, an
// instruction in PTX).
size_t count_of(const std::string& text, const std::string& what);

// The first output of graph node `node`.
int out0(const ir::Graph& g, int node);

// x[..., start:end] as a slice_copy node over the last dim; its result.
int slice_last(ir::Graph& g, int x, int64_t start, int64_t end);

// Lowering outside the compiler: tensors are the graph's value ids, kernel
// names are "<prefix>_test", the source is collected.
class TestLowerContext : public ops::LowerContext {
 public:
  explicit TestLowerContext(const ir::Graph& g) : g_(g) {}
  const ir::Graph& graph() const override { return g_; }
  uint32_t tensor(int value) const override { return static_cast<uint32_t>(value); }
  std::string kernel_name(const std::string& prefix) override { return prefix + "_test"; }
  void add_source(const std::string& source) override { source_ += source; }
  void add_module_source(const std::string&, const std::string& source, uint32_t) override { source_ += source; }
  uint32_t add_derived_weight(engine::DerivedWeight, engine::DType, std::vector<int64_t>) override {
    return 0x7fff0000u + added_++;
  }
  uint32_t add_state(const std::string&, uint64_t) override { return 0x7fff0000u + added_++; }
  const std::string& source() const { return source_; }

 private:
  const ir::Graph& g_;
  std::string source_;
  uint32_t added_ = 0;  // tensors the plan added (derived weights, states), numbered past any value
};

}  // namespace kiln::testing
