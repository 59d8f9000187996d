// What the fusion pass hands to memory planning and lowering: the graph's
// nodes grouped into the launches the engine will make.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine_format/engine_desc.h"

namespace kiln::passes {

// out = epilogue(alpha * a @ B + beta * c), B = b or b^T (b_transposed).
// Value ids refer to the graph; views are resolved to their storage later.
struct GemmPlan {
  int a = -1, b = -1, bias = -1, c = -1, out = -1;
  bool b_transposed = false;
  engine::GemmEpilogue epilogue = engine::GemmEpilogue::kNone;
  float alpha = 1.0f, beta = 0.0f;
  int64_t m = 0, n = 0, k = 0;
};

// One generated kernel: `nodes` (elementwise, topological order) computed per
// output element; `inputs` are the values read from memory (broadcast to the
// output's shape). No nodes means a plain copy of inputs[0] into `out`.
struct PointwisePlan {
  std::vector<int> nodes;
  std::vector<int> inputs;
  int out = -1;
  // Set for a dimension reorder of inputs[0] (no nodes): output dim j reads
  // input dim permutation[j].
  std::vector<int64_t> permutation;
};

struct PlannedOp {
  enum class Kind { kGemm, kPointwise } kind = Kind::kPointwise;
  std::string label;  // the op group, e.g. "addmm+relu" or "add+gelu"
  GemmPlan gemm;
  PointwisePlan pointwise;

  std::vector<int> reads() const;  // value ids read
  int writes() const { return kind == Kind::kGemm ? gemm.out : pointwise.out; }
};

struct ExecPlan {
  std::vector<PlannedOp> ops;
  // value -> the value whose storage it reinterprets (views); resolved to the
  // root, so alias_of never maps to another alias.
  std::map<int, int> alias_of;

  int storage_of(int value) const {
    auto it = alias_of.find(value);
    return it == alias_of.end() ? value : it->second;
  }
};

}  // namespace kiln::passes
