// The launch plan the ops produce: each engine step an op plans is a
// StepPlan (what it reads and writes, and how it lowers itself to an
// engine::Step), wrapped in a PlannedOp with its label. Op planning sees the
// fusion pass through PlanContext; lowering sees the compiler through
// LowerContext. Both are interfaces so ops depend on neither passes/ nor
// compiler/ (layering: ir <- codegen <- ops <- passes <- compiler).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "codegen/cuda_dtype.h"
#include "engine_format/engine_desc.h"
#include "ir/graph.h"
#include "ops/op_options.h"

namespace kiln::ops {

// What lowering needs from the compiler.
class LowerContext {
 public:
  virtual ~LowerContext() = default;
  virtual const ir::Graph& graph() const = 0;
  // The engine tensor holding `value`'s storage (views resolve to their
  // root). Throws CompileError when the value has none.
  virtual uint32_t tensor(int value) const = 0;
  // A fresh kernel function name "<prefix>_<k>" in the engine's one module.
  virtual std::string kernel_name(const std::string& prefix) = 0;
  // Appends CUDA source to the module (after the shared prelude).
  virtual void add_source(const std::string& source) = 0;
  // `source`, defining the kernel `name` (from kernel_name), as a module of its own: cubins only
  // for the targeted SMs >= min_sm (PTX for the oldest of those when PTX is emitted), without the
  // grid-dependency patch (its steps launch after their predecessor completes). Throws
  // CompileError when no targeted SM is >= min_sm.
  virtual void add_module_source(const std::string& name, const std::string& source, uint32_t min_sm) = 0;
  // A weight the runtime makes at load from other weights (engine::DerivedWeight), as a tensor
  // of `dtype` and `shape`; returns the engine tensor.
  virtual uint32_t add_derived_weight(engine::DerivedWeight weight, engine::DType dtype,
                                      std::vector<int64_t> shape) = 0;
  // A state of the step's own (zeroed bytes, keyed `key`, shared only by engines naming that
  // key), as a uint8 tensor; returns the engine tensor.
  virtual uint32_t add_state(const std::string& key, uint64_t nbytes) = 0;

  engine::KernelArg tensor_arg(int value) const;
  static engine::KernelArg int_arg(int64_t v);
};

// A value a step reads as indices and the values it can take, [lo, hi) (what: what they index).
struct ValueRange {
  int value = -1;
  int64_t lo = 0, hi = 0;
  std::string what;
};

// One engine step an op planned. Value ids refer to the graph.
class StepPlan {
 public:
  virtual ~StepPlan() = default;
  virtual std::vector<int> reads() const = 0;
  virtual int writes() const = 0;
  // Values the step reads as indices in a narrower range than the ops it computes take
  // (OpDef::index_ranges): recorded for the graph inputs among them (compiler/input_bounds.h).
  virtual std::vector<ValueRange> index_ranges() const { return {}; }
  // Further values the step writes (a launch group: each member's result).
  virtual std::vector<int> also_writes() const { return {}; }
  // Fills `step` (kind and payload; the label is set by the caller).
  virtual void lower(LowerContext& ctx, engine::Step& step) const = 0;
  virtual std::unique_ptr<StepPlan> clone() const = 0;
};

template <class Derived>
class StepPlanBase : public StepPlan {
 public:
  std::unique_ptr<StepPlan> clone() const override {
    return std::make_unique<Derived>(static_cast<const Derived&>(*this));
  }
};

// A planned step with its label (the op group, e.g. "addmm+relu"). Copies
// deep-copy the plan, so passes may edit a copy freely.
struct PlannedOp {
  std::string label;
  std::unique_ptr<StepPlan> plan;

  PlannedOp() = default;
  PlannedOp(std::string label_in, std::unique_ptr<StepPlan> plan_in)
      : label(std::move(label_in)), plan(std::move(plan_in)) {}
  template <class T>
  PlannedOp(std::string label_in, T p) : label(std::move(label_in)), plan(std::make_unique<T>(std::move(p))) {}
  PlannedOp(const PlannedOp& other) : label(other.label), plan(other.plan ? other.plan->clone() : nullptr) {}
  PlannedOp& operator=(const PlannedOp& other) {
    if (this != &other) {
      label = other.label;
      plan = other.plan ? other.plan->clone() : nullptr;
    }
    return *this;
  }
  PlannedOp(PlannedOp&&) = default;
  PlannedOp& operator=(PlannedOp&&) = default;

  template <class T>
  T* as() { return dynamic_cast<T*>(plan.get()); }
  template <class T>
  const T* as() const { return dynamic_cast<const T*>(plan.get()); }
  template <class T>
  bool is() const { return as<T>() != nullptr; }

  std::vector<int> reads() const { return plan->reads(); }
  int writes() const { return plan->writes(); }
  // writes() then also_writes().
  std::vector<int> all_writes() const {
    std::vector<int> w{plan->writes()};
    for (int v : plan->also_writes()) w.push_back(v);
    return w;
  }
};

using codegen::AffineMap;  // codegen/cuda_dtype.h

// out = epilogue(alpha * a @ B + beta * c), B = b or b^T (b_transposed).
// Lowered to a cuBLASLt step, or a generated kernel when `gemv` (gemm_ops.cpp).
struct GemmPlan : StepPlanBase<GemmPlan> {
  int a = -1, b = -1, bias = -1, c = -1, out = -1;
  bool b_transposed = false;
  engine::GemmEpilogue epilogue = engine::GemmEpilogue::kNone;
  float alpha = 1.0f, beta = 0.0f;
  int64_t m = 0, n = 0, k = 0;
  // Batched products (bmm): `batch` matrices, each operand's i-th matrix
  // stride_* elements after the previous one (0 broadcasts it).
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0, stride_out = 0;
  // Lowered to a generated matrix-vector kernel instead (gemv_kernel.h).
  bool gemv = false;
  // gemv only: `a` is an RMSNorm's input, normalized in the kernel's
  // prologue (a_row * rsqrt(mean(a_row^2) + norm_eps) * norm_weight, the
  // weight optional): the norm planned no kernel of its own (norm_ops.cpp).
  bool rms_norm = false;
  int norm_weight = -1;
  double norm_eps = 0.0;
  // gemv only: the elementwise kernel (its nodes, `pair_nodes`) that read
  // this product's last-dim halves (columns [0, n/2) as value pair_first,
  // [n/2, n) as pair_second) is computed here, per column pair; `out` is
  // its result, [m, n/2] (passes/gemv_pair_epilogue.cpp).
  bool paired = false;
  int pair_first = -1, pair_second = -1;
  std::vector<int> pair_nodes;
  // gemv only: the grid-loop steps (ops/grid_loop.h) that alone read this
  // product's output, each iteration i of member j one column,
  // loop_offsets[j] + i, with its rotary partner (a decode layer's q rotary,
  // k rotary + cache write, v cache write; passes/gemv_loop_epilogue.cpp),
  // run in the kernel's epilogue: a warp computes columns c and
  // c + loop_half of a block of 2 * loop_half columns, stores both, then runs
  // the members' iterations of those two columns. One launch fewer a layer.
  std::vector<PlannedOp> loop_members;
  std::vector<int64_t> loop_offsets;
  int64_t loop_half = 0;
  // gemv only: b is a constant and the kernels launch programmatically
  // (OpOptions::overlap_launches): each lane's first weight loads go above
  // the kernel's grid-dependency wait, while its predecessor still runs.
  bool early_weights = false;

  std::vector<int> reads() const override;
  int writes() const override { return out; }
  std::vector<int> also_writes() const override;
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// A channels-last 2-D convolution through cuDNN (conv_ops.cpp):
// out = act(conv(x, w) + bias + z), x [n,h,w,c], w [k,r,s,c/groups].
struct ConvPlan : StepPlanBase<ConvPlan> {
  int x = -1, w = -1, bias = -1, z = -1, out = -1;
  int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1, groups = 1;
  bool relu = false;

  std::vector<int> reads() const override;
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// A channels-last pooling window op ([n,h,w,c] -> [n,p,q,c]), one generated
// kernel (pool_ops.cpp, pool_kernel.cpp).
struct PoolPlan : StepPlanBase<PoolPlan> {
  enum class Kind { kMax, kAvg, kAdaptiveAvg } kind = Kind::kMax;
  int input = -1, out = -1;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  bool count_include_pad = true;
  int64_t divisor_override = 0;  // 0: none

  std::vector<int> reads() const override { return {input}; }
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// One generated elementwise kernel (elementwise_kernel.cpp): `nodes`
// (elementwise, topological order) computed per output element; `inputs`
// are the values read from memory (broadcast to the output's shape). No
// nodes means a plain copy of inputs[0] into `out`.
struct PointwisePlan : StepPlanBase<PointwisePlan> {
  // An input read straight from the storage a layout chain (slice, permute,
  // select, view) would have copied it out of: element `i` of the output's
  // iteration reads `storage` at map.base + sum(index_d * map.coef[d]). The
  // chain's own kernel then has no reader and is dropped (fuse.cpp).
  struct StridedInput {
    int input = -1;    // the value the nodes name (the chain's result)
    int storage = -1;  // the value actually read
    AffineMap map;     // over the output's dims
  };
  std::vector<int> nodes;
  std::vector<int> inputs;
  std::vector<StridedInput> strided;
  int out = -1;
  // Layout kernels (no nodes, one input): iterate over `iter_shape` (empty:
  // the output's shape), read inputs[0] through `input_map` and write `out`
  // through `output_map`; an empty coef means contiguous over the iteration.
  std::vector<int64_t> iter_shape;
  AffineMap input_map;
  AffineMap output_map;

  const StridedInput* strided_input(int value) const {
    for (const StridedInput& s : strided)
      if (s.input == value) return &s;
    return nullptr;
  }
  // The storage input `value` is read from.
  int storage_read(int value) const {
    const StridedInput* s = strided_input(value);
    return s ? s->storage : value;
  }
  std::vector<int> reads() const override {
    std::vector<int> r;
    for (int in : inputs) r.push_back(storage_read(in));
    return r;
  }
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// A reduction over `dims` of `input` (sum, mean or amax), one generated
// kernel accumulating in float (reduce_ops.cpp, reduce_kernel.cpp).
struct ReducePlan : StepPlanBase<ReducePlan> {
  enum class Kind { kSum, kMean, kMax } kind = Kind::kSum;
  int input = -1;
  int out = -1;
  std::vector<int64_t> dims;  // normalized, ascending

  std::vector<int> reads() const override { return {input}; }
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// A row normalization (layer norm, group norm, batch norm on batch
// statistics, which instance norm becomes), one generated kernel
// (norm_ops.cpp, norm_kernel.cpp). The iteration space is `row_shape`
// (rows) x `elem_shape` (the elements of one row); element (r..., e...)
// lives at sum(index * data_coef) in `input` and `out` (same shape and
// layout) and its affine parameters at sum(index * param_coef) in `weight`
// and `bias` (each optional, -1 when absent). Each row is normalized by its
// own mean and biased variance, computed in float:
//   out = (x - mean) * rsqrt(var + eps) * weight + bias.
struct NormPlan : StepPlanBase<NormPlan> {
  int input = -1, weight = -1, bias = -1, out = -1;
  std::vector<int64_t> row_shape, elem_shape;
  std::vector<int64_t> data_coef, param_coef;  // row dims, then element dims
  // Non-empty: `input` is read at input_base + these coefficients (row dims, then element dims)
  // instead of data_coef's, e.g. a slice of a larger tensor read in place (layout_ops.h
  // strided_source); the output keeps data_coef.
  std::vector<int64_t> input_coef;
  int64_t input_base = 0;
  double eps = 1e-5;

  int64_t rows() const;
  int64_t row_size() const;
  std::vector<int> reads() const override;
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// A depthwise convolution (groups == c == k) as one generated kernel
// (depthwise_kernel.cpp): conv.x [n,h,w,c], `weight` the OHWI weight
// permuted to [r,s,c], conv.bias/relu as in ConvPlan (conv.z unused);
// conv.out is the conv's value, never stored: the elementwise chain
// `epilogue` (nodes, its other `inputs`, scalars/per-channel/full-shape) is
// computed on it per element and writes `out` (conv.out when empty).
struct DepthwisePlan : StepPlanBase<DepthwisePlan> {
  ConvPlan conv;
  int weight = -1;
  PointwisePlan epilogue;
  int out = -1;

  std::vector<int> reads() const override;
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// What an op's planning sees of the fusion pass (passes/fuse.cpp).
class PlanContext {
 public:
  virtual ~PlanContext() = default;
  virtual ir::Graph& graph() = 0;
  virtual const OpOptions& options() const = 0;
  // Nodes (indices) reading `value`; graph outputs are marked separately.
  virtual const std::vector<int>& consumers(int value) const = 0;
  virtual bool is_output(int value) const = 0;
  virtual bool absorbed(int node) const = 0;
  // Marks a later node as computed by a step this op planned.
  virtual void absorb(int node) = 0;
  // Appends a step at the current position.
  virtual void emit(PlannedOp op) = 0;
  // Appends a step when the walk reaches `node` (an absorbed node whose
  // operands all exist there), e.g. a conv that absorbed a later residual add.
  virtual void emit_at(int node, PlannedOp op) = 0;
  // `value` reinterprets `source`'s storage (a view).
  virtual void alias(int value, int source) = 0;

  // The only consumer of `value` when it has exactly one, is not a graph
  // output and that consumer is not absorbed yet; -1 otherwise.
  int sole_consumer(int value) const;
};

}  // namespace kiln::ops
