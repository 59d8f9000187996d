// Resampling and padding: upsample_nearest2d and upsample_bilinear2d (.vec
// and .default), constant_pad_nd, reflection_pad{1,2,3}d and
// replication_pad{1,2,3}d. Each is one generated gather kernel
// (resample_kernel.h) over the row-major (NCHW) tensor: one thread per output
// element computes its source element(s) with PyTorch's index formulas.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op_query.h"
#include "ops/step_plan.h"

namespace kiln::ops {

// How one output coordinate of an interpolated dim finds its source
// (ATen's UpSample.h, the CPU kernels).
struct InterpAxis {
  enum class Mode {
    kCopy,    // output size == input size: source = dst
    kHalf,    // nearest, output size == 2 * input size: source = dst >> 1
    kNearest, // min(floor(float(dst) * scale), in - 1)
    kLinear,  // area_pixel_compute_source_index(scale, dst, align_corners), two taps
  } mode = Mode::kCopy;
  float scale = 1.0f;  // input / output (or 1 / scale_factor, or (in-1)/(out-1))
  bool align_corners = false;
};

// ATen's compute_scales_value<float>: 1/scale when a positive scale is
// given, else in/out (float division).
float compute_scales_value(double scale, int64_t in, int64_t out);
// The axis of a nearest / linear resize from `in` to `out`; `scale` <= 0
// means none was given (PyTorch's optional scales_h/scales_w).
InterpAxis nearest_axis(int64_t in, int64_t out, double scale);
InterpAxis linear_axis(int64_t in, int64_t out, bool align_corners, double scale);

// One resample/pad step: out[o] = f(in), over tensors of equal rank.
struct ResamplePlan : StepPlanBase<ResamplePlan> {
  enum class Kind { kNearest, kBilinear, kConstantPad, kReflectPad, kReplicatePad } kind = Kind::kNearest;
  int input = -1, out = -1;
  // Pads: per dim, output coordinate o reads input coordinate o - before[d]
  // (negative: cropping); outside the input it is `value` (constant),
  // reflected about the edge (reflect) or clamped to it (replicate).
  std::vector<int64_t> before;
  float value = 0.0f;
  // Interpolation: the last two dims (h, w) of a 4-D tensor.
  InterpAxis h, w;

  std::vector<int> reads() const override { return {input}; }
  int writes() const override { return out; }
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

bool is_resample_op(const std::string& op);

// Empty when the compiler takes the node, else why not.
std::string check_resample(const OpQuery& query);

// The plan of a node; throws CompileError when its attributes and shapes do
// not agree.
ResamplePlan plan_resample(const ir::Graph& graph, const ir::Node& node);

}  // namespace kiln::ops
