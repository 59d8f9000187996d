// Generated-kernel steps (KernelStep in engine_desc.h), format side: payload
// codec, validator, inspect fields and one-line summary. The runtime half is
// runtime/steps/kernel_step_exec.cpp.
//
// Payload: u32 module; str function; u32 grid[3]; u32 block[3];
//          u32 shared_bytes; u32 min_blocks (format v6; 0: fixed grid);
//          u32 a; a x {u8 kind; u32 tensor | i64 | f32}
#include <cstdint>
#include <cstdio>
#include <string>

#include "engine_format/byte_io.h"
#include "engine_format/engine_format.h"
#include "engine_format/engine_validate_internal.h"
#include "engine_format/step_format.h"

namespace kiln::engine {
namespace {

// CUDA launch limits common to every supported GPU.
constexpr uint64_t kMaxBlockThreads = 1024;
constexpr uint32_t kMaxBlockDim[3] = {1024, 1024, 64};
constexpr uint32_t kMaxGridDim[3] = {0x7fffffffu, 65535, 65535};
constexpr size_t kMinArgBytes = 1 + 4;

void write(const Step& s, ByteWriter* w) {
  const KernelStep& k = s.kernel;
  w->put_u32(k.module);
  w->put_string(k.function);
  for (uint32_t v : k.grid) w->put_u32(v);
  for (uint32_t v : k.block) w->put_u32(v);
  w->put_u32(k.shared_bytes);
  w->put_u32(k.min_blocks);
  w->put_u32(static_cast<uint32_t>(k.args.size()));
  for (const KernelArg& a : k.args) {
    w->put_u8(static_cast<uint8_t>(a.kind));
    switch (a.kind) {
      case KernelArgKind::kTensor: w->put_u32(a.tensor); break;
      case KernelArgKind::kInt64: w->put_i64(a.i64); break;
      case KernelArgKind::kFloat32: w->put_f32(a.f32); break;
    }
  }
}

Status read(ByteReader& r, uint32_t i, Step* s) {
  KernelStep* k = &s->kernel;
  KILN_READ_OR_RETURN(r.read_u32(&k->module), "step %u kernel module", i);
  KILN_READ_OR_RETURN(r.read_string(&k->function), "step %u kernel function", i);
  for (uint32_t d = 0; d < 3; ++d)
    KILN_READ_OR_RETURN(r.read_u32(&k->grid[d]), "step %u kernel grid[%u]", i, d);
  for (uint32_t d = 0; d < 3; ++d)
    KILN_READ_OR_RETURN(r.read_u32(&k->block[d]), "step %u kernel block[%u]", i, d);
  KILN_READ_OR_RETURN(r.read_u32(&k->shared_bytes), "step %u kernel shared_bytes", i);
  KILN_READ_OR_RETURN(r.read_u32(&k->min_blocks), "step %u kernel min_blocks", i);
  uint32_t count = 0;
  KILN_READ_OR_RETURN(r.read_count(&count, kMinArgBytes), "step %u kernel arg count", i);
  k->args.resize(count);
  for (uint32_t a = 0; a < count; ++a) {
    KernelArg& arg = k->args[a];
    uint8_t kind = 0;
    KILN_READ_OR_RETURN(r.read_u8(&kind), "step %u kernel arg %u kind", i, a);
    // The kind decides how many bytes follow, so it is checked here.
    switch (kind) {
      case static_cast<uint8_t>(KernelArgKind::kTensor):
        arg.kind = KernelArgKind::kTensor;
        KILN_READ_OR_RETURN(r.read_u32(&arg.tensor), "step %u kernel arg %u tensor", i, a);
        break;
      case static_cast<uint8_t>(KernelArgKind::kInt64):
        arg.kind = KernelArgKind::kInt64;
        KILN_READ_OR_RETURN(r.read_i64(&arg.i64), "step %u kernel arg %u int64", i, a);
        break;
      case static_cast<uint8_t>(KernelArgKind::kFloat32):
        arg.kind = KernelArgKind::kFloat32;
        KILN_READ_OR_RETURN(r.read_f32(&arg.f32), "step %u kernel arg %u float32", i, a);
        break;
      default:
        return make_status(StatusCode::kCorruptData, "step %u kernel arg %u: unknown kind %u", i,
                           a, static_cast<unsigned>(kind));
    }
  }
  return Status::ok();
}

// Launch sizes within CUDA's limits, arguments well-formed, and the
// generated-kernel convention proven: the first argument is the tensor the
// kernel writes, and every int64 argument is an element count of the
// iteration, at most that tensor's element count (pointwise, layout, pool,
// reduce and depthwise kernels all loop `i < n` over their output, see
// compiler.cpp). So a count cannot send a kernel past its output.
Status validate(const StepCheck& check) {
  const EngineDesc& desc = check.desc();
  const KernelStep& k = check.step().kernel;
  const char* label = check.label().c_str();
  if (k.module >= desc.modules.size())
    return invalid("%s: module %u out of range (engine has %zu modules)", label, k.module,
                   desc.modules.size());
  if (k.function.empty()) return invalid("%s: empty function name", label);
  uint64_t threads = 1;
  for (int d = 0; d < 3; ++d) {
    if (k.grid[d] == 0 || k.grid[d] > kMaxGridDim[d])
      return invalid("%s: grid dim %d is %u (must be 1..%u)", label, d, k.grid[d],
                     kMaxGridDim[d]);
    if (k.block[d] == 0 || k.block[d] > kMaxBlockDim[d])
      return invalid("%s: block dim %d is %u (must be 1..%u)", label, d, k.block[d],
                     kMaxBlockDim[d]);
    threads *= k.block[d];  // each factor <= 1024: cannot overflow
  }
  if (threads > kMaxBlockThreads)
    return invalid("%s: block of %llu threads exceeds %llu", label,
                   static_cast<unsigned long long>(threads),
                   static_cast<unsigned long long>(kMaxBlockThreads));
  // A persistent kernel: grid[0] is its most blocks, the runtime picks the count at load.
  if (k.min_blocks > 0) {
    if (k.min_blocks > k.grid[0])
      return invalid("%s: min_blocks %u exceeds grid[0] %u (the most blocks a persistent kernel may use)",
                     label, k.min_blocks, k.grid[0]);
    if (k.grid[1] != 1 || k.grid[2] != 1)
      return invalid("%s: a persistent kernel (min_blocks %u) has grid %ux%ux%u; expected grid[1] == "
                     "grid[2] == 1",
                     label, k.min_blocks, k.grid[0], k.grid[1], k.grid[2]);
  }
  bool has_count = false;
  for (uint32_t a = 0; a < k.args.size(); ++a) {
    const KernelArg& arg = k.args[a];
    if (static_cast<uint8_t>(arg.kind) > static_cast<uint8_t>(KernelArgKind::kFloat32))
      return invalid("%s: arg %u kind %u out of range", label, a,
                     static_cast<unsigned>(arg.kind));
    if (arg.kind == KernelArgKind::kTensor && arg.tensor >= desc.tensors.size())
      return invalid("%s: arg %u tensor %u out of range (engine has %zu tensors)", label, a,
                     arg.tensor, desc.tensors.size());
    has_count |= arg.kind == KernelArgKind::kInt64;
  }
  if (!has_count) return Status::ok();
  if (k.args[0].kind != KernelArgKind::kTensor)
    return invalid("%s: arg 0 must be the output tensor when the kernel takes an int64 count",
                   label);
  const uint32_t out = k.args[0].tensor;
  if (is_weight(desc.tensors[out].storage))
    return invalid("%s: arg 0 (the output) %s is a weight", label,
                   check.tensor_label(out).c_str());
  for (uint32_t a = 0; a < k.args.size(); ++a) {
    const KernelArg& arg = k.args[a];
    if (arg.kind == KernelArgKind::kInt64 && arg.i64 > check.numel(out))
      return invalid("%s: arg %u count %lld exceeds the %lld elements of its output (arg 0, %s)",
                     label, a, static_cast<long long>(arg.i64),
                     static_cast<long long>(check.numel(out)), check.tensor_label(out).c_str());
  }
  return Status::ok();
}

void describe(const Step& s, StepFieldSink& out) {
  const KernelStep& k = s.kernel;
  out.integer("module", k.module);
  out.text("function", k.function);
  out.integers("grid", {k.grid[0], k.grid[1], k.grid[2]});
  out.integers("block", {k.block[0], k.block[1], k.block[2]});
  out.integer("shared_bytes", k.shared_bytes);
  out.integer("min_blocks", k.min_blocks);
  out.begin_list("args");
  for (const KernelArg& arg : k.args) {
    out.begin_record();
    switch (arg.kind) {
      case KernelArgKind::kTensor:
        out.text("kind", "tensor");
        out.tensor("tensor", arg.tensor);
        break;
      case KernelArgKind::kInt64:
        out.text("kind", "int64");
        out.integer("value", arg.i64);
        break;
      case KernelArgKind::kFloat32:
        out.text("kind", "float32");
        out.real("value", arg.f32);
        break;
    }
  }
  out.end_list();
}

std::string summary(const EngineDesc&, const Step& s) {
  const KernelStep& k = s.kernel;
  char text[192];
  if (k.min_blocks > 0)
    std::snprintf(text, sizeof(text), "kernel %s persistent grid<=%u (min %u) block=%ux%u", k.function.c_str(),
                  k.grid[0], k.min_blocks, k.block[0], k.block[1]);
  else
    std::snprintf(text, sizeof(text), "kernel %s grid=%ux%u block=%ux%u", k.function.c_str(),
                  k.grid[0], k.grid[1], k.block[0], k.block[1]);
  return text;
}

}  // namespace

extern const StepFormat kKernelStepFormat = {StepKind::kKernel, "kernel", write, read, validate,
                                             describe, summary};

}  // namespace kiln::engine
