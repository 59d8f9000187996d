// GEMM steps (GemmStep in engine_desc.h), format side: payload codec,
// validator, inspect fields and one-line summary. The runtime half is
// runtime/steps/gemm_step_exec.cpp.
//
// Payload: u32 a, b, bias, c, out; i64 m, n, k; u8 b_transposed; u8 epilogue;
//          f32 alpha, beta; i64 batch, stride_a, stride_b, stride_c, stride_out
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "engine_format/byte_io.h"
#include "engine_format/engine_format.h"
#include "engine_format/engine_validate_internal.h"
#include "engine_format/step_format.h"

namespace kiln::engine {
namespace {

bool uses_bias(GemmEpilogue epilogue) {
  return epilogue == GemmEpilogue::kBias || epilogue == GemmEpilogue::kReluBias;
}

const char* epilogue_name(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::kNone: return "none";
    case GemmEpilogue::kBias: return "bias";
    case GemmEpilogue::kReluBias: return "relu_bias";
    case GemmEpilogue::kRelu: return "relu";
  }
  return "unknown";
}

void write(const Step& s, ByteWriter* w) {
  const GemmStep& g = s.gemm;
  w->put_u32(g.a);
  w->put_u32(g.b);
  w->put_u32(g.bias);
  w->put_u32(g.c);
  w->put_u32(g.out);
  w->put_i64(g.m);
  w->put_i64(g.n);
  w->put_i64(g.k);
  w->put_u8(g.b_transposed ? 1 : 0);
  w->put_u8(static_cast<uint8_t>(g.epilogue));
  w->put_f32(g.alpha);
  w->put_f32(g.beta);
  w->put_i64(g.batch);
  w->put_i64(g.stride_a);
  w->put_i64(g.stride_b);
  w->put_i64(g.stride_c);
  w->put_i64(g.stride_out);
}

Status read(ByteReader& r, uint32_t i, Step* s) {
  GemmStep* g = &s->gemm;
  KILN_READ_OR_RETURN(r.read_u32(&g->a), "step %u gemm a", i);
  KILN_READ_OR_RETURN(r.read_u32(&g->b), "step %u gemm b", i);
  KILN_READ_OR_RETURN(r.read_u32(&g->bias), "step %u gemm bias", i);
  KILN_READ_OR_RETURN(r.read_u32(&g->c), "step %u gemm c", i);
  KILN_READ_OR_RETURN(r.read_u32(&g->out), "step %u gemm out", i);
  KILN_READ_OR_RETURN(r.read_i64(&g->m), "step %u gemm m", i);
  KILN_READ_OR_RETURN(r.read_i64(&g->n), "step %u gemm n", i);
  KILN_READ_OR_RETURN(r.read_i64(&g->k), "step %u gemm k", i);
  KILN_READ_OR_RETURN(r.read_bool(&g->b_transposed), "step %u gemm b_transposed", i);
  uint8_t epilogue = 0;
  KILN_READ_OR_RETURN(r.read_u8(&epilogue), "step %u gemm epilogue", i);
  g->epilogue = static_cast<GemmEpilogue>(epilogue);  // range-checked by validate
  KILN_READ_OR_RETURN(r.read_f32(&g->alpha), "step %u gemm alpha", i);
  KILN_READ_OR_RETURN(r.read_f32(&g->beta), "step %u gemm beta", i);
  KILN_READ_OR_RETURN(r.read_i64(&g->batch), "step %u gemm batch", i);
  KILN_READ_OR_RETURN(r.read_i64(&g->stride_a), "step %u gemm stride_a", i);
  KILN_READ_OR_RETURN(r.read_i64(&g->stride_b), "step %u gemm stride_b", i);
  KILN_READ_OR_RETURN(r.read_i64(&g->stride_c), "step %u gemm stride_c", i);
  KILN_READ_OR_RETURN(r.read_i64(&g->stride_out), "step %u gemm stride_out", i);
  return Status::ok();
}

// batch / stride_* consistency, before the operands are measured with them.
Status validate_batch(const StepCheck& check) {
  const GemmStep& g = check.step().gemm;
  const char* label = check.label().c_str();
  // cuBLASLt takes the batch count as an int32.
  if (g.batch < 1 || g.batch > std::numeric_limits<int32_t>::max())
    return invalid("%s: batch %lld must be 1..%d", label, static_cast<long long>(g.batch),
                   std::numeric_limits<int32_t>::max());
  const std::pair<const char*, int64_t> strides[] = {{"stride_a", g.stride_a},
                                                     {"stride_b", g.stride_b},
                                                     {"stride_c", g.stride_c},
                                                     {"stride_out", g.stride_out}};
  for (const auto& st : strides) {
    if (g.batch == 1 && st.second != 0)
      return invalid("%s: %s is %lld but batch is 1 (strides must be 0 then)", label, st.first,
                     static_cast<long long>(st.second));
    if (st.second < 0)
      return invalid("%s: %s %lld is negative", label, st.first,
                     static_cast<long long>(st.second));
  }
  if (g.batch > 1) {
    // Output matrices must not overlap: they are written concurrently.
    int64_t one = 0;
    if (!checked_mul(g.m, g.n, &one) || g.stride_out < one)
      return invalid("%s: stride_out %lld is smaller than one [%lld, %lld] output matrix "
                     "(outputs would overlap)",
                     label, static_cast<long long>(g.stride_out), static_cast<long long>(g.m),
                     static_cast<long long>(g.n));
    if (g.c == kNoTensor && g.stride_c != 0)
      return invalid("%s: stride_c %lld set but there is no c", label,
                     static_cast<long long>(g.stride_c));
  }
  return Status::ok();
}

// Every operand is proven to hold what the product reads or writes: a
// [m, k] (k: n x k or k x n), out and c [m, n], each `batch` times at its
// stride (0: one matrix for every batch entry), bias exactly n elements.
Status validate(const StepCheck& check) {
  const EngineDesc& desc = check.desc();
  const GemmStep& g = check.step().gemm;
  const char* label = check.label().c_str();
  if (static_cast<uint8_t>(g.epilogue) > static_cast<uint8_t>(GemmEpilogue::kRelu))
    return invalid("%s: epilogue %u out of range", label, static_cast<unsigned>(g.epilogue));
  if (g.m <= 0 || g.n <= 0 || g.k <= 0)
    return invalid("%s: dims m=%lld n=%lld k=%lld must be positive", label,
                   static_cast<long long>(g.m), static_cast<long long>(g.n),
                   static_cast<long long>(g.k));
  const bool bias = uses_bias(g.epilogue);
  if (bias && g.bias == kNoTensor) return invalid("%s: epilogue needs a bias tensor", label);
  if (!bias && g.bias != kNoTensor)
    return invalid("%s: bias tensor %u set but the epilogue does not use it", label, g.bias);

  KILN_RETURN_IF_ERROR(check.tensor_ref("gemm a", g.a));
  KILN_RETURN_IF_ERROR(check.tensor_ref("gemm b", g.b));
  KILN_RETURN_IF_ERROR(check.tensor_ref("gemm out", g.out));
  if (bias) KILN_RETURN_IF_ERROR(check.tensor_ref("gemm bias", g.bias));
  if (g.c != kNoTensor) KILN_RETURN_IF_ERROR(check.tensor_ref("gemm c", g.c));

  KILN_RETURN_IF_ERROR(validate_batch(check));
  const int64_t batch = g.batch;
  KILN_RETURN_IF_ERROR(check.batched_matrix("gemm a", g.a, g.m, g.k, batch, g.stride_a));
  KILN_RETURN_IF_ERROR(check.batched_matrix("gemm out", g.out, g.m, g.n, batch, g.stride_out));
  if (g.b_transposed)
    KILN_RETURN_IF_ERROR(check.batched_matrix("gemm b", g.b, g.n, g.k, batch, g.stride_b));
  else
    KILN_RETURN_IF_ERROR(check.batched_matrix("gemm b", g.b, g.k, g.n, batch, g.stride_b));
  // One bias vector serves every batch entry.
  if (bias) KILN_RETURN_IF_ERROR(check.matrix("gemm bias", g.bias, 1, g.n));
  if (g.c != kNoTensor)
    KILN_RETURN_IF_ERROR(check.batched_matrix("gemm c", g.c, g.m, g.n, batch, g.stride_c));

  DType dtype = desc.tensors[g.a].dtype;
  const std::pair<const char*, uint32_t> operands[] = {
      {"b", g.b}, {"out", g.out}, {"bias", bias ? g.bias : kNoTensor}, {"c", g.c}};
  for (const auto& op : operands) {
    if (op.second == kNoTensor) continue;
    DType other = desc.tensors[op.second].dtype;
    if (other != dtype)
      return invalid("%s: gemm %s %s is %s but a is %s", label, op.first,
                     check.tensor_label(op.second).c_str(), dtype_name(other), dtype_name(dtype));
  }
  if (is_weight(desc.tensors[g.out].storage))
    return invalid("%s: gemm out %s is a weight", label, check.tensor_label(g.out).c_str());
  return Status::ok();
}

std::string inspect_summary(const GemmStep& g) {
  char text[256];
  int n = std::snprintf(text, sizeof(text), "m=%lld n=%lld k=%lld epilogue=%s",
                        static_cast<long long>(g.m), static_cast<long long>(g.n),
                        static_cast<long long>(g.k), epilogue_name(g.epilogue));
  if (g.batch > 1 && n > 0 && static_cast<size_t>(n) < sizeof(text))
    std::snprintf(text + n, sizeof(text) - n,
                  " batch=%lld strides a=%lld b=%lld%s out=%lld", static_cast<long long>(g.batch),
                  static_cast<long long>(g.stride_a), static_cast<long long>(g.stride_b),
                  g.c != kNoTensor ? (" c=" + std::to_string(g.stride_c)).c_str() : "",
                  static_cast<long long>(g.stride_out));
  return text;
}

void describe(const Step& s, StepFieldSink& out) {
  const GemmStep& g = s.gemm;
  out.integer("m", g.m);
  out.integer("n", g.n);
  out.integer("k", g.k);
  out.text("epilogue", epilogue_name(g.epilogue));
  out.flag("b_transposed", g.b_transposed);
  out.real("alpha", g.alpha);
  out.real("beta", g.beta);
  out.tensor("a", g.a);
  out.tensor("b", g.b);
  out.tensor("bias", g.bias);
  out.tensor("c", g.c);
  out.tensor("out", g.out);
  out.integer("batch", g.batch);
  out.integers("strides", {g.stride_a, g.stride_b, g.stride_c, g.stride_out});
  out.text("summary", inspect_summary(g));
}

std::string summary(const EngineDesc&, const Step& s) {
  const GemmStep& g = s.gemm;
  char text[192];
  std::snprintf(text, sizeof(text), "gemm m=%lld n=%lld k=%lld batch=%lld",
                static_cast<long long>(g.m), static_cast<long long>(g.n),
                static_cast<long long>(g.k), static_cast<long long>(g.batch));
  return text;
}

}  // namespace

extern const StepFormat kGemmStepFormat = {StepKind::kGemm, "gemm", write, read, validate,
                                           describe, summary};

}  // namespace kiln::engine
