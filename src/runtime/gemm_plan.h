// A GEMM step (engine::GemmStep) as cuBLASLt runs it: descriptors made once
// at Engine::load and the algorithm chosen at load (never at export, never
// during execute or graph capture).
//
// Algorithm choice (choose_gemm_algorithm): cublasLtMatmulAlgoGetHeuristic
// proposes up to kGemmCandidates algorithms within the workspace cap; each is
// run on scratch operands placed at the real operands' alignments, on a
// private stream (1 warm-up + up to 3 timed runs, CUDA events), candidates
// cuBLASLt refuses are skipped, and the fastest wins. Choices are cached
// process-wide by the full GEMM signature (gemm_algo_key.h) in the same
// AlgoCache (and $KILN_ALGO_CACHE file) as conv choices. KILN_GEMM_AUTOTUNE=0
// keeps the heuristic's first choice and runs nothing at load.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "common/status.h"
#include "engine_format/engine_desc.h"
#include "runtime/conv_algo_cache.h"

namespace kiln::runtime {

// Upper bound for the cuBLASLt workspace an algorithm may ask for.
constexpr size_t kMaxGemmWorkspaceBytes = 32u << 20;
// Heuristic candidates timed per GEMM signature.
constexpr int kGemmCandidates = 8;

// A GEMM step as cuBLASLt sees it. cuBLASLt is column-major, so the row-major
// out[m, n] = a[m, k] @ B is computed as D_col[n, m] = op(b) * a_col: cuBLASLt's
// A is GemmStep::b and its B is GemmStep::a. Descriptors are owned by the
// Engine and destroyed with it (destroy_gemm_plan).
struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr;  // GemmStep::b
  cublasLtMatrixLayout_t layout_b = nullptr;  // GemmStep::a
  cublasLtMatrixLayout_t layout_d = nullptr;  // out, and c when present
  // c of a batched GEMM (its own batch stride); null: c uses layout_d.
  cublasLtMatrixLayout_t layout_c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;
  float alpha = 1.0f;
  float beta = 0.0f;  // 0 unless the step has a c operand
  // False when the bias is not a weight (its address differs per context):
  // `op` then carries a placeholder with the same alignment and each context
  // makes its own descriptor with make_matmul_desc() (steps/gemm_step_exec.cpp).
  bool op_has_bias = true;
  std::string key;  // the algorithm cache key, for messages

  cublasLtMatrixLayout_t c_layout() const { return layout_c != nullptr ? layout_c : layout_d; }
};

// Device addresses of one GEMM's operands in cuBLASLt's naming (a =
// GemmStep::b, b = GemmStep::a); c == d when the step has no c.
struct GemmOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
};

// A matmul descriptor for validated step `g` with `bias` as its bias pointer
// (ignored without a bias epilogue). The caller owns it.
Result<cublasLtMatmulDesc_t> make_matmul_desc(const engine::GemmStep& g, const void* bias);

// Makes the layouts of validated step `g` in `plan` (alpha/beta too).
// kUnsupported for a dtype cuBLASLt is not used for.
Status create_gemm_layouts(const engine::GemmStep& g, engine::DType dtype, GemmPlan* plan);
void destroy_gemm_plan(GemmPlan* plan);

// A preference descriptor capping the workspace at `workspace_cap` and
// telling the heuristic the operands' real alignments (cuBLASLt naming).
// The caller owns it (cublasLtMatmulPreferenceDestroy).
Result<cublasLtMatmulPreference_t> make_gemm_preference(size_t workspace_cap, uint32_t align_a,
                                                        uint32_t align_b, uint32_t align_c,
                                                        uint32_t align_d);

// What choose_gemm_algorithm borrows; all owned by the caller.
struct GemmTuner {
  cublasLtHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;  // private to the load
  void* workspace = nullptr;      // workspace_cap bytes
  size_t workspace_cap = 0;
  AlgoCache* cache = nullptr;
};

// Heuristic top-1 (KILN_GEMM_AUTOTUNE=0): sets plan->algo/workspace_bytes
// from the first usable result, runs nothing.
Status choose_gemm_heuristic(cublasLtHandle_t handle, cublasLtMatmulPreference_t pref,
                             size_t workspace_cap, GemmPlan* plan);

// Sets plan->algo / workspace_bytes: from the cache when plan->key was seen
// before (checked with cublasLtMatmulAlgoCheck and one run), else by timing
// the heuristic's candidates. `timing_op` equals plan->op but with a bias
// pointer into scratch (plan->op's may be a placeholder); `scratch` must be
// laid out like the real operands (alignments; c == d when c is out).
// Always runs the chosen algorithm once, so its kernel is loaded before any
// CUDA graph capture.
Status choose_gemm_algorithm(const GemmTuner& tuner, cublasLtMatmulDesc_t timing_op,
                             cublasLtMatmulPreference_t pref, const GemmOperands& scratch,
                             GemmPlan* plan);

}  // namespace kiln::runtime
