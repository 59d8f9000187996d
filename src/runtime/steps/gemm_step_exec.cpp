// GEMM steps, run side (the format half is
// engine_format/steps/gemm_step_format.cpp). At load: cuBLASLt descriptors and
// algorithm choice for every GEMM step; per context: each step's pointers
// (and, for a bias outside the weights, its own descriptor); run: one
// cublasLtMatmul.
//
// Algorithm choice at load. Candidates from the heuristic are timed on scratch
// buffers that mimic the real operands' alignments, on a private stream, and
// the winner is cached process-wide (AlgoCache, shared with convs), so later
// engines and loads with the same GEMM shapes only pay one trial run per step.
// KILN_GEMM_AUTOTUNE=0: the heuristic's first choice, nothing run at load.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/conv_algo_cache.h"
#include "runtime/cuda_check.h"
#include "runtime/engine.h"
#include "runtime/gemm_algo_key.h"
#include "runtime/gemm_plan.h"
#include "runtime/load_scratch.h"
#include "runtime/log.h"
#include "runtime/step_runtime.h"
#include "runtime/steps/gemm_step_exec.h"

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

// What load made for every GEMM step; owned by the Engine.
class GemmPlans : public StepKindPlans {
 public:
  ~GemmPlans() override {
    for (GemmPlan& p : plans) destroy_gemm_plan(&p);
    if (cublas != nullptr) (void)cublasLtDestroy(cublas);
    (void)cudaGetLastError();
  }
  Result<std::unique_ptr<StepKindContext>> create_context(const Engine& engine) const override;

  cublasLtHandle_t cublas = nullptr;
  std::vector<GemmPlan> plans;  // per step (GEMM steps only)
};

// rebind's hook for a bias that lives in the context's memory.
Status set_bias_pointer(void* op, void* address) {
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      static_cast<cublasLtMatmulDesc_t>(op), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &address,
      sizeof(address)));
  return Status::ok();
}

class GemmExecutor : public StepExecutor {
 public:
  GemmExecutor(cublasLtHandle_t cublas, const GemmPlan& plan, void* workspace,
               size_t workspace_bytes)
      : cublas_(cublas), plan_(plan), op_(plan.op), workspace_(workspace),
        workspace_bytes_(workspace_bytes) {}
  ~GemmExecutor() override {
    if (owned_op_ != nullptr) (void)cublasLtMatmulDescDestroy(owned_op_);
  }

  Status run(cudaStream_t stream) override {
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
        cublas_, op_, &plan_.alpha, a_, plan_.layout_a, b_, plan_.layout_b, &plan_.beta, c_,
        plan_.c_layout(), d_, plan_.layout_d, &plan_.algo, workspace_, workspace_bytes_, stream));
    return Status::ok();
  }

  cublasLtHandle_t cublas_;
  const GemmPlan& plan_;
  cublasLtMatmulDesc_t op_;                // the engine's, or owned_op_
  cublasLtMatmulDesc_t owned_op_ = nullptr;
  void* a_ = nullptr;  // cuBLASLt A (GemmStep::b)
  void* b_ = nullptr;  // cuBLASLt B (GemmStep::a)
  void* c_ = nullptr;
  void* d_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;  // the context's whole workspace, as before
};

class GemmContext : public StepKindContext {
 public:
  GemmContext(const GemmPlans& plans, const Engine& engine) : plans_(plans), engine_(engine) {}

  Result<std::unique_ptr<StepExecutor>> make_executor(size_t step, StepBinder& binder) override {
    const engine::EngineDesc& desc = engine_.desc();
    const GemmStep& g = desc.steps[step].gemm;
    const GemmPlan& plan = plans_.plans[step];
    auto ex = std::make_unique<GemmExecutor>(plans_.cublas, plan, binder.workspace(),
                                             binder.workspace_bytes());
    if (!plan.op_has_bias) {
      // The bias lives in this context's memory: give the step a descriptor
      // of its own that points at it.
      Result<cublasLtMatmulDesc_t> op = make_matmul_desc(g, binder.address(g.bias));
      if (!op.is_ok()) return op.status().with_context(step_label(desc, step));
      ex->owned_op_ = ex->op_ = op.value();
      binder.bind_with(g.bias, set_bias_pointer, ex->op_);
    }
    binder.bind(g.b, &ex->a_);
    binder.bind(g.a, &ex->b_);
    binder.bind(g.out, &ex->d_);
    // Without c, C aliases D and beta is 0, so C is never read.
    binder.bind(g.c != engine::kNoTensor ? g.c : g.out, &ex->c_);
    return std::unique_ptr<StepExecutor>(std::move(ex));
  }

 private:
  const GemmPlans& plans_;
  const Engine& engine_;
};

Result<std::unique_ptr<StepKindContext>> GemmPlans::create_context(const Engine& engine) const {
  return std::unique_ptr<StepKindContext>(std::make_unique<GemmContext>(*this, engine));
}

// The descriptors (no algorithm yet) of GEMM step `step`.
Status create_gemm_plan(const StepLoadEnv& env, size_t step, GemmPlan* plan) {
  const GemmStep& g = env.desc.steps[step].gemm;
  // A weight bias has one address for every context; any other bias gets a
  // stand-in with the same alignment, which is all the heuristic looks at.
  const void* bias = nullptr;
  if (uses_bias(g.epilogue)) {
    const TensorDesc& t = env.desc.tensors[g.bias];
    if (engine::is_weight(t.storage)) {
      bias = env.weight_address(t);
    } else {
      bias = reinterpret_cast<const void*>(static_cast<uintptr_t>(address_alignment(t)));
      plan->op_has_bias = false;
    }
  }
  KILN_ASSIGN_OR_RETURN(plan->op, make_matmul_desc(g, bias));
  return create_gemm_layouts(g, env.desc.tensors[g.a].dtype, plan);
}

// Every GEMM step's descriptors and algorithm.
Result<std::unique_ptr<StepKindPlans>> load(StepLoadEnv& env) {
  const engine::EngineDesc& desc = env.desc;
  const DeviceInfo& device = env.device;
  size_t a_bytes = 0, b_bytes = 0, c_bytes = 0, out_bytes = 0, bias_bytes = 0;
  bool any_gemm = false;
  for (const auto& step : desc.steps) {
    if (step.kind != StepKind::kGemm) continue;
    any_gemm = true;
    const GemmStep& g = step.gemm;
    a_bytes = std::max<size_t>(a_bytes, desc.tensors[g.a].nbytes);
    b_bytes = std::max<size_t>(b_bytes, desc.tensors[g.b].nbytes);
    out_bytes = std::max<size_t>(out_bytes, desc.tensors[g.out].nbytes);
    if (g.c != engine::kNoTensor) c_bytes = std::max<size_t>(c_bytes, desc.tensors[g.c].nbytes);
    if (uses_bias(g.epilogue))
      bias_bytes = std::max<size_t>(bias_bytes, desc.tensors[g.bias].nbytes);
  }
  if (!any_gemm) return std::unique_ptr<StepKindPlans>();
  // On failure `plans` is destroyed, which frees what was made so far.
  auto plans = std::make_unique<GemmPlans>();
  plans->plans.resize(desc.steps.size());
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&plans->cublas));
  cublasLtHandle_t cublas = plans->cublas;

  bool autotune = gemm_autotune_enabled();
  LoadScratch res;  // freed on every path out
  GemmScratch scratch;
  GemmTuner tuner;
  tuner.handle = cublas;
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
  for (size_t i = 0; i < desc.steps.size(); ++i) {
    if (desc.steps[i].kind != StepKind::kGemm) continue;
    GemmPlan& plan = plans->plans[i];
    Status status = create_gemm_plan(env, i, &plan);
    if (!status.is_ok()) return status.with_context(step_label(desc, i));
    const GemmStep& g = desc.steps[i].gemm;

    const auto align = [&](uint32_t t) {
      return t == engine::kNoTensor ? 256u : address_alignment(desc.tensors[t]);
    };
    const bool in_place = c_is_out(desc, g);
    const GemmSignature sig = make_gemm_signature(
        g, desc.tensors[g.a].dtype, in_place, device.sm, device.sm_count, lt_version,
        align(g.a), align(g.b), align(g.c), align(g.bias), align(g.out));
    plan.key = gemm_cache_key(sig);
    const std::string where = step_label(desc, i) + " (" + plan.key + ")";

    // cuBLASLt's A is GemmStep::b, its B is GemmStep::a; C aliases D without c.
    const uint32_t align_c = g.c != engine::kNoTensor ? align(g.c) : sig.align_out;
    StepResources step_res;
    Result<cublasLtMatmulPreference_t> pref = make_gemm_preference(
        tuner.workspace_cap, sig.align_b, sig.align_a, align_c, sig.align_out);
    if (!pref.is_ok()) return pref.status().with_context(where);
    step_res.pref = pref.value();

    if (!autotune) {
      status = choose_gemm_heuristic(cublas, step_res.pref, tuner.workspace_cap, &plan);
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
    env.workspace_bytes = std::max(env.workspace_bytes, plan.workspace_bytes);
  }
  return std::unique_ptr<StepKindPlans>(std::move(plans));
}

}  // namespace

const GemmPlan* gemm_step_plan(const Engine& engine, size_t step) {
  const auto* plans = static_cast<const GemmPlans*>(engine.step_plans(StepKind::kGemm));
  if (plans == nullptr || step >= engine.desc().steps.size() ||
      engine.desc().steps[step].kind != StepKind::kGemm)
    return nullptr;
  return &plans->plans[step];
}

extern const StepRuntime kGemmStepRuntime = {StepKind::kGemm, LoadStage::kAfterWeights, load};

}  // namespace kiln::runtime
