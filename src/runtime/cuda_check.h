// One checked macro per GPU library. Every CUDA runtime and cuBLASLt call in
// the runtime goes through these, so a failure always comes back as a Status
// that names the call, where it was made and what the library said.
#pragma once

#include <cublasLt.h>
#include <cudnn.h>
#include <cuda_runtime_api.h>

#include "common/status.h"

namespace kiln::runtime {

// The StatusCode a CUDA error maps to: out of memory, no usable GPU/driver
// (kUnavailable), code that does not fit this GPU (kIncompatible), else
// kInternal.
StatusCode cuda_error_code(cudaError_t error);
StatusCode cublas_error_code(cublasStatus_t status);
StatusCode cudnn_error_code(cudnnStatus_t status);

// "<call> failed (file.cpp:123): cudaErrorMemoryAllocation: out of memory".
// Also clears the runtime's last-error slot so a later cudaGetLastError check
// does not report this failure a second time.
Status cuda_error_status(cudaError_t error, const char* call, const char* file, int line);
Status cublas_error_status(cublasStatus_t status, const char* call, const char* file,
                           int line);
Status cudnn_error_status(cudnnStatus_t status, const char* call, const char* file, int line);

}  // namespace kiln::runtime

// Evaluates `expr` (a cudaError_t) once; returns a Status from the enclosing
// function (Status or Result<T>) when it is not cudaSuccess.
#define KILN_CUDA_RETURN_IF_ERROR(expr)                                          \
  do {                                                                           \
    const cudaError_t kiln_cuda_error_ = (expr);                                 \
    if (kiln_cuda_error_ != cudaSuccess)                                         \
      return ::kiln::runtime::cuda_error_status(kiln_cuda_error_, #expr, __FILE__, \
                                                __LINE__);                       \
  } while (0)

// Same for a cublasStatus_t.
#define KILN_CUBLAS_RETURN_IF_ERROR(expr)                                            \
  do {                                                                               \
    const cublasStatus_t kiln_cublas_status_ = (expr);                               \
    if (kiln_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                \
      return ::kiln::runtime::cublas_error_status(kiln_cublas_status_, #expr, __FILE__, \
                                                  __LINE__);                         \
  } while (0)

// Same for a cudnnStatus_t.
#define KILN_CUDNN_RETURN_IF_ERROR(expr)                                            \
  do {                                                                              \
    const cudnnStatus_t kiln_cudnn_status_ = (expr);                                \
    if (kiln_cudnn_status_ != CUDNN_STATUS_SUCCESS)                                 \
      return ::kiln::runtime::cudnn_error_status(kiln_cudnn_status_, #expr, __FILE__, \
                                                 __LINE__);                         \
  } while (0)
