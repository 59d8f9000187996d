#include "runtime/cuda_check.h"

#include <cstring>

namespace kiln::runtime {
namespace {

// Messages carry the file name, not the build machine's absolute path.
const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash != nullptr ? slash + 1 : path;
}

}  // namespace

StatusCode cuda_error_code(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return StatusCode::kOutOfMemory;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return StatusCode::kUnavailable;
    case cudaErrorInvalidKernelImage:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidPtx:
    case cudaErrorJitCompilerNotFound:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorJitCompilationDisabled:
      return StatusCode::kIncompatible;
    default:
      return StatusCode::kInternal;
  }
}

StatusCode cublas_error_code(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return StatusCode::kOutOfMemory;
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return StatusCode::kUnavailable;
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return StatusCode::kIncompatible;
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return StatusCode::kUnsupported;
    default:
      return StatusCode::kInternal;
  }
}

StatusCode cudnn_error_code(cudnnStatus_t status) {
  // cuDNN 9 statuses are grouped by their thousands digit.
  if (status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    return StatusCode::kOutOfMemory;
  if (status == CUDNN_STATUS_NOT_INITIALIZED || status == CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED ||
      status == CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH)
    return StatusCode::kUnavailable;
  if (status == CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH) return StatusCode::kIncompatible;
  if (status / 1000 == CUDNN_STATUS_NOT_SUPPORTED / 1000) return StatusCode::kUnsupported;
  return StatusCode::kInternal;
}

Status cuda_error_status(cudaError_t error, const char* call, const char* file, int line) {
  // Non-sticky errors stay in the last-error slot until read; read it here so
  // the next launch check does not blame the wrong call.
  (void)cudaGetLastError();
  return make_status(cuda_error_code(error), "%s failed (%s:%d): %s: %s", call,
                     base_name(file), line, cudaGetErrorName(error), cudaGetErrorString(error));
}

Status cublas_error_status(cublasStatus_t status, const char* call, const char* file,
                           int line) {
  return make_status(cublas_error_code(status), "%s failed (%s:%d): %s: %s", call,
                     base_name(file), line, cublasLtGetStatusName(status),
                     cublasLtGetStatusString(status));
}

Status cudnn_error_status(cudnnStatus_t status, const char* call, const char* file, int line) {
  char last[256] = {0};
  // cuDNN 9 keeps a per-thread message for the last error; it says which
  // parameter it disliked, which the status alone does not.
  cudnnGetLastErrorString(last, sizeof(last));
  last[sizeof(last) - 1] = '\0';
  return make_status(cudnn_error_code(status), "%s failed (%s:%d): %s%s%s", call, base_name(file),
                     line, cudnnGetErrorString(status), last[0] != '\0' ? ": " : "", last);
}

}  // namespace kiln::runtime
