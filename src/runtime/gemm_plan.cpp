#include "runtime/gemm_plan.h"

#include <cstring>
#include <mutex>

#include "runtime/cuda_check.h"
#include "runtime/log.h"
#include "runtime/stream_timer.h"

namespace kiln::runtime {

using engine::DType;
using engine::GemmEpilogue;
using engine::GemmStep;

namespace {

static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(GemmAlgoChoice::algo),
              "the cache stores cublasLtMatmulAlgo_t as 8 words");

constexpr int kTimedRuns = 3;
// A candidate whose single timed run takes longer is not run again (keeps
// the search of large GEMMs short; their timings are stable anyway).
constexpr float kLongRunMs = 1.0f;
// A candidate replaces the best so far only when faster by more than this
// fraction, so timing noise keeps the heuristic's order.
constexpr float kMinGain = 0.01f;

Result<cudaDataType_t> gemm_data_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    default:
      return make_status(StatusCode::kUnsupported, "GEMM on %s is not supported",
                         engine::dtype_name(dtype));
  }
}

bool uses_bias(GemmEpilogue epilogue) {
  return epilogue == GemmEpilogue::kBias || epilogue == GemmEpilogue::kReluBias;
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kReluBias:
      return CUBLASLT_EPILOGUE_RELU_BIAS;
    case GemmEpilogue::kRelu:
      return CUBLASLT_EPILOGUE_RELU;
    case GemmEpilogue::kNone:
      break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Sets everything a matmul descriptor needs for step `g`. fp32 accumulation
// and fp32 alpha/beta for every dtype; CUBLAS_COMPUTE_32F (not the TF32 mode)
// so float32 results match PyTorch's fp32 matmul to ~1e-5.
Status configure_matmul_desc(cublasLtMatmulDesc_t op, const GemmStep& g, const void* bias) {
  const int32_t trans_a = g.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t trans_b = CUBLAS_OP_N;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  const cublasLtEpilogue_t epilogue = lt_epilogue(g.epilogue);
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (uses_bias(g.epilogue)) {
    // Bias length must equal D's row count, which is n in the column-major
    // view; its dtype defaults to D's.
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  return Status::ok();
}

// Makes `layout` a strided batch of `batch` matrices `stride` elements apart.
Status set_batch(cublasLtMatrixLayout_t layout, int64_t batch, int64_t stride) {
  const int32_t count = static_cast<int32_t>(batch);  // validated <= INT32_MAX
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  return Status::ok();
}

// One matmul of `plan`'s layouts with `op` and `algo` on `stream`. No allocation.
Status enqueue_matmul(const GemmTuner& t, cublasLtMatmulDesc_t op, const GemmPlan& plan,
                      const cublasLtMatmulAlgo_t& algo, size_t workspace_bytes,
                      const GemmOperands& ops) {
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      t.handle, op, &plan.alpha, ops.a, plan.layout_a, ops.b, plan.layout_b, &plan.beta, ops.c,
      plan.c_layout(), ops.d, plan.layout_d, &algo, workspace_bytes == 0 ? nullptr : t.workspace,
      workspace_bytes, t.stream));
  return Status::ok();
}

// One run, waited for: the warm-up (loads the kernel) and the check that
// cuBLASLt accepts the algorithm on these operands.
Status trial_run(const GemmTuner& t, cublasLtMatmulDesc_t op, const GemmPlan& plan,
                 const cublasLtMatmulAlgo_t& algo, size_t workspace_bytes,
                 const GemmOperands& ops) {
  KILN_RETURN_IF_ERROR(enqueue_matmul(t, op, plan, algo, workspace_bytes, ops));
  KILN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(t.stream));
  return Status::ok();
}

// "algo 21 tile 18 stages 9 splitk 1" for the debug log.
std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
  const struct {
    cublasLtMatmulAlgoConfigAttributes_t attr;
    const char* name;
  } fields[] = {{CUBLASLT_ALGO_CONFIG_ID, "algo"},
                {CUBLASLT_ALGO_CONFIG_TILE_ID, "tile"},
                {CUBLASLT_ALGO_CONFIG_STAGES_ID, "stages"},
                {CUBLASLT_ALGO_CONFIG_SPLITK_NUM, "splitk"}};
  std::string text;
  for (const auto& f : fields) {
    uint32_t value = 0;  // every field above is 32 bits (int32 or uint32)
    size_t written = 0;
    const cublasStatus_t s =
        cublasLtMatmulAlgoConfigGetAttribute(&algo, f.attr, &value, sizeof(value), &written);
    if (!text.empty()) text += " ";
    text += f.name;
    text += " ";
    text += s == CUBLAS_STATUS_SUCCESS ? std::to_string(value) : std::string("?");
  }
  return text;
}

// The cached choice for plan->key if cuBLASLt still accepts it here.
bool try_cached(const GemmTuner& t, cublasLtMatmulDesc_t timing_op, const GemmOperands& scratch,
                GemmPlan* plan) {
  GemmAlgoChoice choice;
  if (!t.cache->lookup(plan->key, &choice)) return false;
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, choice.algo, sizeof(algo));
  cublasLtMatmulHeuristicResult_t check;
  std::memset(&check, 0, sizeof(check));
  const cublasStatus_t s = cublasLtMatmulAlgoCheck(t.handle, plan->op, plan->layout_a,
                                                   plan->layout_b, plan->c_layout(),
                                                   plan->layout_d, &algo, &check);
  bool ok = s == CUBLAS_STATUS_SUCCESS && check.state == CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= t.workspace_cap;
  if (ok) ok = trial_run(t, timing_op, *plan, algo, check.workspaceSize, scratch).is_ok();
  if (!ok) {
    (void)cudaGetLastError();
    t.cache->erase(plan->key);
    KILN_LOG_DEBUG("gemm %s: cached algorithm refused here, searching again", plan->key.c_str());
    return false;
  }
  plan->algo = algo;
  plan->workspace_bytes = check.workspaceSize;
  KILN_LOG_DEBUG("gemm %s: cached %s, %zu workspace bytes (%.4f ms when searched)",
                 plan->key.c_str(), describe_algo(algo).c_str(), plan->workspace_bytes,
                 static_cast<double>(choice.time_ms));
  return true;
}

// Times one candidate; an error when cuBLASLt refuses it. `best_ms` < 0:
// nothing timed yet.
Result<float> time_candidate(const GemmTuner& t, cublasLtMatmulDesc_t op, const GemmPlan& plan,
                             const cublasLtMatmulHeuristicResult_t& r,
                             const GemmOperands& scratch, float best_ms) {
  KILN_RETURN_IF_ERROR(trial_run(t, op, plan, r.algo, r.workspaceSize, scratch));  // warm-up
  StreamTimer timer;
  const auto once = [&] { return enqueue_matmul(t, op, plan, r.algo, r.workspaceSize, scratch); };
  KILN_ASSIGN_OR_RETURN(float first, timer.time(t.stream, 1, once));
  // Long runs are stable enough; a clear loser needs no more runs.
  if (first >= kLongRunMs || (best_ms >= 0.0f && first > 2.0f * best_ms)) return first;
  return timer.time(t.stream, kTimedRuns, once);
}

Status search(const GemmTuner& t, cublasLtMatmulDesc_t timing_op, cublasLtMatmulPreference_t pref,
              const GemmOperands& scratch, GemmPlan* plan) {
  cublasLtMatmulHeuristicResult_t results[kGemmCandidates];
  std::memset(results, 0, sizeof(results));
  int returned = 0;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(
      t.handle, plan->op, plan->layout_a, plan->layout_b, plan->c_layout(), plan->layout_d, pref,
      kGemmCandidates, results, &returned));

  int best = -1, tried = 0, refused = 0;
  float best_ms = -1.0f, top_ms = -1.0f;  // top: the heuristic's first usable choice
  Status last_error =
      make_status(StatusCode::kUnsupported, "cublasLtMatmulAlgoGetHeuristic returned nothing");
  for (int r = 0; r < returned; ++r) {
    if (results[r].state != CUBLAS_STATUS_SUCCESS || results[r].workspaceSize > t.workspace_cap)
      continue;
    ++tried;
    Result<float> ms = time_candidate(t, timing_op, *plan, results[r], scratch, best_ms);
    if (!ms.is_ok()) {
      // cuBLASLt refused this candidate on these operands: try the next.
      (void)cudaGetLastError();
      ++refused;
      last_error = ms.status().with_context("candidate " + std::to_string(r));
      continue;
    }
    if (top_ms < 0.0f) top_ms = ms.value();
    if (best < 0 || ms.value() < best_ms * (1.0f - kMinGain)) {
      best = r;
      best_ms = ms.value();
    }
  }
  if (best < 0)
    return Status(StatusCode::kUnsupported,
                  "no cuBLASLt algorithm ran (" + std::to_string(returned) +
                      " proposed; last error: " + last_error.message() + ")");
  plan->algo = results[best].algo;
  plan->workspace_bytes = results[best].workspaceSize;
  KILN_LOG_DEBUG(
      "gemm %s: chose heuristic #%d of %d timed (%d refused): %s, %zu workspace bytes, "
      "%.4f ms (heuristic top-1 %.4f ms)",
      plan->key.c_str(), best, tried, refused, describe_algo(plan->algo).c_str(),
      plan->workspace_bytes, static_cast<double>(best_ms), static_cast<double>(top_ms));
  GemmAlgoChoice choice;
  std::memcpy(choice.algo, &plan->algo, sizeof(choice.algo));
  choice.workspace_bytes = plan->workspace_bytes;
  choice.time_ms = best_ms;
  t.cache->insert(plan->key, choice);
  return Status::ok();
}

}  // namespace

Result<cublasLtMatmulDesc_t> make_matmul_desc(const GemmStep& g, const void* bias) {
  cublasLtMatmulDesc_t op = nullptr;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  Status status = configure_matmul_desc(op, g, bias);
  if (!status.is_ok()) {
    (void)cublasLtMatmulDescDestroy(op);
    return status;
  }
  return op;
}

Status create_gemm_layouts(const GemmStep& g, DType dtype, GemmPlan* plan) {
  KILN_ASSIGN_OR_RETURN(cudaDataType_t type, gemm_data_type(dtype));
  const bool has_c = g.c != engine::kNoTensor;
  plan->alpha = g.alpha;
  plan->beta = has_c ? g.beta : 0.0f;
  const uint64_t m = static_cast<uint64_t>(g.m), n = static_cast<uint64_t>(g.n),
                 k = static_cast<uint64_t>(g.k);
  if (g.b_transposed)  // b is row-major [n, k] == column-major k x n, used transposed
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->layout_a, type, k, n, k));
  else  // b is row-major [k, n] == column-major n x k
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->layout_a, type, n, k, n));
  // a is row-major [m, k] == column-major k x m.
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->layout_b, type, k, m, k));
  // out (and c) are row-major [m, n] == column-major n x m.
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->layout_d, type, n, m, n));
  if (g.batch > 1) {
    // Strided batch; a stride of 0 makes every batch entry read one matrix.
    KILN_RETURN_IF_ERROR(set_batch(plan->layout_a, g.batch, g.stride_b));
    KILN_RETURN_IF_ERROR(set_batch(plan->layout_b, g.batch, g.stride_a));
    KILN_RETURN_IF_ERROR(set_batch(plan->layout_d, g.batch, g.stride_out));
    if (has_c) {
      KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->layout_c, type, n, m, n));
      KILN_RETURN_IF_ERROR(set_batch(plan->layout_c, g.batch, g.stride_c));
    }
  }
  return Status::ok();
}

void destroy_gemm_plan(GemmPlan* p) {
  if (p->op != nullptr) (void)cublasLtMatmulDescDestroy(p->op);
  if (p->layout_a != nullptr) (void)cublasLtMatrixLayoutDestroy(p->layout_a);
  if (p->layout_b != nullptr) (void)cublasLtMatrixLayoutDestroy(p->layout_b);
  if (p->layout_d != nullptr) (void)cublasLtMatrixLayoutDestroy(p->layout_d);
  if (p->layout_c != nullptr) (void)cublasLtMatrixLayoutDestroy(p->layout_c);
  *p = GemmPlan();
}

Result<cublasLtMatmulPreference_t> make_gemm_preference(size_t workspace_cap, uint32_t align_a,
                                                        uint32_t align_b, uint32_t align_c,
                                                        uint32_t align_d) {
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const auto set = [&]() -> Status {
    const uint64_t max_workspace = workspace_cap;
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
    // The heuristic assumes 256-byte aligned operands unless told otherwise;
    // arena offsets may be less aligned than that.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
    for (const auto& [attr, value] : aligns)
      KILN_CUBLAS_RETURN_IF_ERROR(
          cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
    return Status::ok();
  };
  Status status = set();
  if (!status.is_ok()) {
    (void)cublasLtMatmulPreferenceDestroy(pref);
    return status;
  }
  return pref;
}

Status choose_gemm_heuristic(cublasLtHandle_t handle, cublasLtMatmulPreference_t pref,
                             size_t workspace_cap, GemmPlan* plan) {
  constexpr int kRequested = 4;
  cublasLtMatmulHeuristicResult_t results[kRequested];
  std::memset(results, 0, sizeof(results));
  int returned = 0;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(
      handle, plan->op, plan->layout_a, plan->layout_b, plan->c_layout(), plan->layout_d, pref,
      kRequested, results, &returned));
  for (int r = 0; r < returned; ++r) {
    if (results[r].state != CUBLAS_STATUS_SUCCESS) continue;
    if (results[r].workspaceSize > workspace_cap) continue;
    plan->algo = results[r].algo;
    plan->workspace_bytes = results[r].workspaceSize;
    KILN_LOG_DEBUG("gemm %s: heuristic top-1 (KILN_GEMM_AUTOTUNE=0): %s", plan->key.c_str(),
                   describe_algo(plan->algo).c_str());
    return Status::ok();
  }
  return make_status(StatusCode::kUnsupported, "cublasLtMatmulAlgoGetHeuristic returned nothing");
}

Status choose_gemm_algorithm(const GemmTuner& tuner, cublasLtMatmulDesc_t timing_op,
                             cublasLtMatmulPreference_t pref, const GemmOperands& scratch,
                             GemmPlan* plan) {
  if (try_cached(tuner, timing_op, scratch, plan)) return Status::ok();
  // Held so concurrent loads neither search one shape twice nor disturb each
  // other's timings (shared with the conv search).
  std::lock_guard<std::mutex> lock(tuner.cache->search_mutex());
  if (try_cached(tuner, timing_op, scratch, plan)) return Status::ok();
  return search(tuner, timing_op, pref, scratch, plan);
}

}  // namespace kiln::runtime
