// Engine::plan_gemms: cuBLASLt descriptors and algorithm choice for every
// GEMM step, at load. Candidates from the heuristic are timed on scratch
// buffers that mimic the real operands' alignments, on a private stream, and
// the winner is cached process-wide (AlgoCache, shared with convs), so later
// engines and loads with the same GEMM shapes only pay one trial run per step.
// KILN_GEMM_AUTOTUNE=0: the heuristic's first choice, nothing run at load.
#include <algorithm>
#include <string>

#include "runtime/conv_algo_cache.h"
#include "runtime/cuda_check.h"
#include "runtime/engine.h"
#include "runtime/gemm_algo_key.h"
#include "runtime/gemm_plan.h"
#include "runtime/load_scratch.h"
#include "runtime/log.h"

namespace kiln::runtime {

using engine::GemmEpilogue;
using engine::GemmStep;
using engine::StepKind;
using engine::StorageKind;
using engine::TensorDesc;

namespace {

bool uses_bias(GemmEpilogue epilogue) {
  return epilogue == GemmEpilogue::kBias || epilogue == GemmEpilogue::kReluBias;
}

// c shares out's memory (same tensor or identical arena range).
bool c_is_out(const engine::EngineDesc& desc, const GemmStep& g) {
  if (g.c == engine::kNoTensor) return false;
  if (g.c == g.out) return true;
  const TensorDesc& c = desc.tensors[g.c];
  const TensorDesc& o = desc.tensors[g.out];
  return c.storage == StorageKind::kArena && o.storage == StorageKind::kArena &&
         c.offset == o.offset;
}

// Destroys what it holds on every path out of one step's planning.
struct StepResources {
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulDesc_t timing_op = nullptr;  // only when it differs from plan.op
  ~StepResources() {
    if (pref != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (timing_op != nullptr) (void)cublasLtMatmulDescDestroy(timing_op);
  }
};

// Scratch operands for every GEMM step: one buffer per role, as large as the
// largest step needs, plus the search workspace.
struct GemmScratch {
  uint8_t* a = nullptr;  // GemmStep::a
  uint8_t* b = nullptr;  // GemmStep::b
  uint8_t* c = nullptr;
  uint8_t* out = nullptr;
  uint8_t* bias = nullptr;
  uint8_t* workspace = nullptr;
};

}  // namespace

Status Engine::plan_gemms() {
  size_t a_bytes = 0, b_bytes = 0, c_bytes = 0, out_bytes = 0, bias_bytes = 0;
  bool any_gemm = false;
  for (const auto& step : desc_.steps) {
    if (step.kind != StepKind::kGemm) continue;
    any_gemm = true;
    const GemmStep& g = step.gemm;
    a_bytes = std::max<size_t>(a_bytes, desc_.tensors[g.a].nbytes);
    b_bytes = std::max<size_t>(b_bytes, desc_.tensors[g.b].nbytes);
    out_bytes = std::max<size_t>(out_bytes, desc_.tensors[g.out].nbytes);
    if (g.c != engine::kNoTensor) c_bytes = std::max<size_t>(c_bytes, desc_.tensors[g.c].nbytes);
    if (uses_bias(g.epilogue))
      bias_bytes = std::max<size_t>(bias_bytes, desc_.tensors[g.bias].nbytes);
  }
  if (!any_gemm) return Status::ok();
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&cublas_));

  bool autotune = gemm_autotune_enabled();
  LoadScratch res;  // freed on every path out
  GemmScratch scratch;
  GemmTuner tuner;
  tuner.handle = cublas_;
  tuner.cache = &AlgoCache::global();
  tuner.workspace_cap = kMaxGemmWorkspaceBytes;
  if (autotune) {
    KILN_ASSIGN_OR_RETURN(tuner.stream, res.stream());
    KILN_ASSIGN_OR_RETURN(tuner.workspace_cap, LoadScratch::workspace_cap(kMaxGemmWorkspaceBytes));
    const auto allocate = [&]() -> Status {
      KILN_ASSIGN_OR_RETURN(scratch.a, res.allocate(a_bytes));
      KILN_ASSIGN_OR_RETURN(scratch.b, res.allocate(b_bytes));
      KILN_ASSIGN_OR_RETURN(scratch.c, res.allocate(c_bytes));
      KILN_ASSIGN_OR_RETURN(scratch.out, res.allocate(out_bytes));
      KILN_ASSIGN_OR_RETURN(scratch.bias, res.allocate(bias_bytes));
      KILN_ASSIGN_OR_RETURN(scratch.workspace, res.allocate(tuner.workspace_cap));
      return Status::ok();
    };
    Status status = allocate();
    if (status.code() == StatusCode::kOutOfMemory) {
      // Timing is an optimisation: without room for scratch, use the heuristic.
      KILN_LOG_DEBUG("gemm autotune off for this engine: %s", status.message().c_str());
      autotune = false;
      tuner.workspace_cap = kMaxGemmWorkspaceBytes;
    } else if (!status.is_ok()) {
      return status.with_context("allocating GEMM autotune scratch");
    }
    tuner.workspace = scratch.workspace;
  }

  const size_t lt_version = cublasLtGetVersion();
  for (size_t i = 0; i < desc_.steps.size(); ++i) {
    if (desc_.steps[i].kind != StepKind::kGemm) continue;
    Status status = create_gemm_plan(i);
    if (!status.is_ok()) return status.with_context(step_label(desc_, i));
    const GemmStep& g = desc_.steps[i].gemm;
    GemmPlan& plan = gemms_[i];

    const auto align = [&](uint32_t t) {
      return t == engine::kNoTensor ? 256u : address_alignment(desc_.tensors[t]);
    };
    const bool in_place = c_is_out(desc_, g);
    const GemmSignature sig = make_gemm_signature(
        g, desc_.tensors[g.a].dtype, in_place, device_.sm, device_.sm_count, lt_version,
        align(g.a), align(g.b), align(g.c), align(g.bias), align(g.out));
    plan.key = gemm_cache_key(sig);
    const std::string where = step_label(desc_, i) + " (" + plan.key + ")";

    // cuBLASLt's A is GemmStep::b, its B is GemmStep::a; C aliases D without c.
    const uint32_t align_c = g.c != engine::kNoTensor ? align(g.c) : sig.align_out;
    StepResources step_res;
    Result<cublasLtMatmulPreference_t> pref = make_gemm_preference(
        tuner.workspace_cap, sig.align_b, sig.align_a, align_c, sig.align_out);
    if (!pref.is_ok()) return pref.status().with_context(where);
    step_res.pref = pref.value();

    if (!autotune) {
      status = choose_gemm_heuristic(cublas_, step_res.pref, tuner.workspace_cap, &plan);
    } else {
      const auto aligned_like = LoadScratch::aligned_like;
      cublasLtMatmulDesc_t timing_op = plan.op;
      if (uses_bias(g.epilogue)) {
        Result<cublasLtMatmulDesc_t> op =
            make_matmul_desc(g, aligned_like(scratch.bias, sig.align_bias));
        if (!op.is_ok()) return op.status().with_context(where);
        step_res.timing_op = timing_op = op.value();
      }
      GemmOperands ops;
      ops.a = aligned_like(scratch.b, sig.align_b);
      ops.b = aligned_like(scratch.a, sig.align_a);
      ops.d = aligned_like(scratch.out, sig.align_out);
      ops.c = g.c == engine::kNoTensor || in_place ? ops.d : aligned_like(scratch.c, align_c);
      status = choose_gemm_algorithm(tuner, timing_op, step_res.pref, ops, &plan);
    }
    if (!status.is_ok())
      return status.with_context("choosing a cuBLASLt algorithm for " + where);
    workspace_bytes_ = std::max(workspace_bytes_, plan.workspace_bytes);
  }
  return Status::ok();
}

Status Engine::create_gemm_plan(size_t step) {
  const GemmStep& g = desc_.steps[step].gemm;
  GemmPlan& plan = gemms_[step];
  // A weight bias has one address for every context; any other bias gets a
  // stand-in with the same alignment, which is all the heuristic looks at.
  const void* bias = nullptr;
  if (uses_bias(g.epilogue)) {
    const TensorDesc& t = desc_.tensors[g.bias];
    if (t.storage == StorageKind::kWeight) {
      bias = static_cast<const uint8_t*>(weights_) + t.offset;
    } else {
      bias = reinterpret_cast<const void*>(static_cast<uintptr_t>(address_alignment(t)));
      plan.op_has_bias = false;
    }
  }
  KILN_ASSIGN_OR_RETURN(plan.op, make_matmul_desc(g, bias));
  return create_gemm_layouts(g, desc_.tensors[g.a].dtype, &plan);
}

Result<cublasLtMatmulDesc_t> Engine::create_matmul_desc(size_t step, const void* bias) const {
  if (step >= desc_.steps.size() || desc_.steps[step].kind != StepKind::kGemm)
    return make_status(StatusCode::kInvalidArgument, "step %zu is not a GEMM step", step);
  return make_matmul_desc(desc_.steps[step].gemm, bias);
}

}  // namespace kiln::runtime
