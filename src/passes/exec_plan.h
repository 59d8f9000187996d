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
  // Batched products (bmm): `batch` matrices, each operand's i-th matrix
  // stride_* elements after the previous one (0 broadcasts it).
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0, stride_out = 0;
};

// A channels-last 2-D convolution (engine::ConvStep):
// out = act(conv(x, w) + bias + z), x [n,h,w,c], w [k,r,s,c/groups].
struct ConvPlan {
  int x = -1, w = -1, bias = -1, z = -1, out = -1;
  int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1, groups = 1;
  bool relu = false;
};

// A channels-last pooling window op ([n,h,w,c] -> [n,p,q,c]), one generated
// kernel (codegen/pool_codegen.h).
struct PoolPlan {
  enum class Kind { kMax, kAvg, kAdaptiveAvg } kind = Kind::kMax;
  int input = -1, out = -1;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  bool count_include_pad = true;
  int64_t divisor_override = 0;  // 0: none
};

// Where element `idx` of an iteration space lives in a contiguous tensor:
// offset = base + sum_j idx_j * coef[j]. Permutes, slices, selects, and the
// pieces of cat and split are all such maps.
struct AffineMap {
  int64_t base = 0;
  std::vector<int64_t> coef;  // one per iteration dimension
};

// One generated kernel: `nodes` (elementwise, topological order) computed per
// output element; `inputs` are the values read from memory (broadcast to the
// output's shape). No nodes means a plain copy of inputs[0] into `out`.
struct PointwisePlan {
  std::vector<int> nodes;
  std::vector<int> inputs;
  int out = -1;
  // Layout kernels (no nodes, one input): iterate over `iter_shape` (empty:
  // the output's shape), read inputs[0] through `input_map` and write `out`
  // through `output_map`; an empty coef means contiguous over the iteration.
  std::vector<int64_t> iter_shape;
  AffineMap input_map;
  AffineMap output_map;
};

// A reduction over `dims` of `input` (sum, mean or amax), one warp per output
// element, accumulating in float.
struct ReducePlan {
  enum class Kind { kSum, kMean, kMax } kind = Kind::kSum;
  int input = -1;
  int out = -1;
  std::vector<int64_t> dims;  // normalized, ascending
};

// A depthwise convolution (groups == c == k) as one generated kernel
// (codegen/depthwise_codegen.h): conv.x [n,h,w,c], `weight` the OHWI weight
// permuted to [r,s,c], conv.bias/relu as in ConvPlan (conv.z unused);
// conv.out is the conv's value, never stored: the elementwise chain
// `epilogue` (nodes, its other `inputs`, scalars/per-channel/full-shape) is
// computed on it per element and writes `out` (conv.out when empty).
struct DepthwisePlan {
  ConvPlan conv;
  int weight = -1;
  PointwisePlan epilogue;
  int out = -1;
};

struct PlannedOp {
  enum class Kind { kGemm, kPointwise, kReduce, kConv, kPool, kDepthwise } kind = Kind::kPointwise;
  std::string label;  // the op group, e.g. "addmm+relu" or "add+gelu"
  GemmPlan gemm;
  PointwisePlan pointwise;
  ReducePlan reduce;
  ConvPlan conv;
  PoolPlan pool;
  DepthwisePlan depthwise;

  std::vector<int> reads() const;  // value ids read
  int writes() const {
    switch (kind) {
      case Kind::kGemm: return gemm.out;
      case Kind::kReduce: return reduce.out;
      case Kind::kConv: return conv.out;
      case Kind::kPool: return pool.out;
      case Kind::kDepthwise: return depthwise.out;
      default: return pointwise.out;
    }
  }
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
