#include "ops/resample_kernel.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "codegen/cuda_dtype.h"

namespace kiln::ops {
using codegen::load_expr;
using codegen::storage_type;
using codegen::store_expr;

namespace {

// An exact float constant: its bit pattern (also right for inf and NaN).
std::string float_literal(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  std::ostringstream s;
  s << "__int_as_float(0x" << std::hex << bits << ")";
  return s.str();
}

using codegen::ll;

// Declares `<p>0`, `<p>1` (source indices) and `<p>l0`, `<p>l1` (weights)
// for output coordinate `d` of an axis from `in` elements; returns the number
// of taps (1: only <p>0 is read).
int axis_source(std::ostringstream& s, const InterpAxis& a, const std::string& p, const std::string& d, int64_t in) {
  using Mode = InterpAxis::Mode;
  switch (a.mode) {
    case Mode::kCopy:
      s << "    const long long " << p << "0 = " << d << ";\n";
      return 1;
    case Mode::kHalf:
      s << "    const long long " << p << "0 = " << d << " >> 1;\n";
      return 1;
    case Mode::kNearest:
      // nearest_neighbor_compute_source_index: min(floor(dst * scale), in - 1)
      s << "    const long long " << p << "0 = min((long long)floorf((float)" << d << " * " << float_literal(a.scale)
        << "), " << ll(in - 1) << ");\n";
      return 1;
    case Mode::kLinear:
      // area_pixel_compute_source_index, then guard_index_and_lambda
      if (a.align_corners)
        s << "    const float " << p << "r = " << float_literal(a.scale) << " * (float)" << d << ";\n";
      else
        s << "    const float " << p << "r = fmaxf(" << float_literal(a.scale) << " * ((float)" << d
          << " + 0.5f) - 0.5f, 0.0f);\n";
      s << "    const long long " << p << "0 = min((long long)floorf(" << p << "r), " << ll(in - 1) << ");\n"
        << "    const long long " << p << "1 = " << p << "0 + (" << p << "0 < " << ll(in - 1) << " ? 1 : 0);\n"
        << "    const float " << p << "l1 = fminf(fmaxf(" << p << "r - (float)" << p << "0, 0.0f), 1.0f);\n"
        << "    const float " << p << "l0 = 1.0f - " << p << "l1;\n";
      return 2;
  }
  return 1;
}

void interpolate(std::ostringstream& s, const ResamplePlan& plan, const ir::Value& in, const ir::Value& out) {
  const int64_t H = in.shape.at(2), W = in.shape.at(3), P = out.shape.at(2), Q = out.shape.at(3);
  s << "    const long long q = i % " << ll(Q) << ";\n"
    << "    const long long p = (i / " << ll(Q) << ") % " << ll(P) << ";\n"
    << "    const " << storage_type(in.dtype) << "* x = in + (i / " << ll(P * Q) << ") * " << ll(H * W) << ";\n";
  const int th = axis_source(s, plan.h, "h", "p", H);
  const int tw = axis_source(s, plan.w, "w", "q", W);
  auto at = [&](const std::string& h, const std::string& w) {
    return load_expr(in.dtype, "x[" + h + " * " + ll(W) + " + " + w + "]");
  };
  auto row = [&](const std::string& h) {
    if (tw == 1) return at(h, "w0");
    return "(wl0 * " + at(h, "w0") + " + wl1 * " + at(h, "w1") + ")";
  };
  if (th == 1)
    s << "    const float v = " << row("h0") << ";\n";
  else
    s << "    const float v = hl0 * " << row("h0") << " + hl1 * " << row("h1") << ";\n";
}

void pad(std::ostringstream& s, const ResamplePlan& plan, const ir::Value& in, const ir::Value& out) {
  using Kind = ResamplePlan::Kind;
  // Dims merged: runs of untouched dims (no padding, same size) are one dim.
  struct Dim {
    int64_t in, out, before;
  };
  std::vector<Dim> dims;
  bool last_untouched = false;
  for (size_t d = 0; d < in.shape.size(); ++d) {
    const bool untouched = plan.before.at(d) == 0 && in.shape[d] == out.shape.at(d);
    if (untouched && last_untouched) {
      dims.back().in *= in.shape[d];
      dims.back().out *= in.shape[d];
    } else {
      dims.push_back({in.shape[d], out.shape[d], plan.before[d]});
    }
    last_untouched = untouched;
  }
  const bool constant = plan.kind == Kind::kConstantPad;
  if (constant) s << "    bool inside = true;\n";
  s << "    long long src = 0;\n";
  int64_t ostride = 1, istride = 1;
  for (size_t j = dims.size(); j-- > 0;) {
    const Dim& d = dims[j];
    const std::string c = "c" + std::to_string(j);
    s << "    long long " << c << " = ";
    if (j == 0)
      s << "i / " << ll(ostride);
    else
      s << "(i / " << ll(ostride) << ") % " << ll(d.out);
    s << ";\n";
    if (d.before != 0 || d.in != d.out) {
      if (d.before != 0) s << "    " << c << " -= " << ll(d.before) << ";\n";
      if (constant)
        s << "    inside = inside && " << c << " >= 0 && " << c << " < " << ll(d.in) << ";\n";
      else if (plan.kind == Kind::kReflectPad)
        s << "    " << c << " = " << c << " < 0 ? -" << c << " : (" << c << " >= " << ll(d.in) << " ? "
          << ll(2 * (d.in - 1)) << " - " << c << " : " << c << ");\n";
      else
        s << "    " << c << " = min(max(" << c << ", 0LL), " << ll(d.in - 1) << ");\n";
    }
    s << "    src += " << c << " * " << ll(istride) << ";\n";
    ostride *= d.out;
    istride *= d.in;
  }
  if (constant)
    s << "    const float v = inside ? " << load_expr(in.dtype, "in[src]") << " : " << float_literal(plan.value)
      << ";\n";
  else
    s << "    const float v = " << load_expr(in.dtype, "in[src]") << ";\n";
}

}  // namespace

uint32_t resample_grid(int64_t n) {
  return static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(1, (n + kResampleBlock - 1) / kResampleBlock), 65536));
}

std::string generate_resample_kernel(const ir::Graph& graph, const ResamplePlan& plan, const std::string& name) {
  using Kind = ResamplePlan::Kind;
  const ir::Value& in = graph.value(plan.input);
  const ir::Value& out = graph.value(plan.out);
  std::ostringstream s;
  s << "extern \"C\" __global__ void __launch_bounds__(" << kResampleBlock << ") " << name << "(\n    "
    << storage_type(out.dtype) << "* __restrict__ out, const " << storage_type(in.dtype)
    << "* __restrict__ in, long long n_out) {\n"
    << "  const long long stride = (long long)gridDim.x * " << kResampleBlock << ";\n"
    << "  for (long long i = (long long)blockIdx.x * " << kResampleBlock
    << " + threadIdx.x; i < n_out; i += stride) {\n";
  if (plan.kind == Kind::kNearest || plan.kind == Kind::kBilinear)
    interpolate(s, plan, in, out);
  else
    pad(s, plan, in, out);
  s << "    out[i] = " << store_expr(out.dtype, "v") << ";\n  }\n}\n";
  return s.str();
}

}  // namespace kiln::ops
