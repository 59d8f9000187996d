// DLPack in and out: a DLTensor is checked and turned into a kiln_tensor
// (then set like any other), and an output is lent as a DLManagedTensor that
// keeps the method's memory alive until the consumer's deleter runs.
#include <new>

#include "c_api_internal.h"
#include "dlpack_abi.h"

namespace kiln::c_api {
namespace {

// kiln_dtype of a DLPack dtype; -1 when none matches.
int32_t to_kiln_dtype(dlpack::DataType t) {
  if (t.lanes != 1) return -1;
  switch (t.code) {
    case dlpack::kInt:
      return t.bits == 8 ? KILN_DTYPE_INT8 : t.bits == 16 ? KILN_DTYPE_INT16 : t.bits == 32 ? KILN_DTYPE_INT32
                                                           : t.bits == 64 ? KILN_DTYPE_INT64 : -1;
    case dlpack::kUInt: return t.bits == 8 ? KILN_DTYPE_UINT8 : -1;
    case dlpack::kFloat:
      return t.bits == 16 ? KILN_DTYPE_FLOAT16 : t.bits == 32 ? KILN_DTYPE_FLOAT32 : t.bits == 64 ? KILN_DTYPE_FLOAT64 : -1;
    case dlpack::kBfloat: return t.bits == 16 ? KILN_DTYPE_BFLOAT16 : -1;
    case dlpack::kBool: return t.bits == 8 ? KILN_DTYPE_BOOL : -1;
    default: return -1;
  }
}

dlpack::DataType to_dl_dtype(int32_t dtype) {
  switch (dtype) {
    case KILN_DTYPE_UINT8: return {dlpack::kUInt, 8, 1};
    case KILN_DTYPE_INT8: return {dlpack::kInt, 8, 1};
    case KILN_DTYPE_INT16: return {dlpack::kInt, 16, 1};
    case KILN_DTYPE_INT32: return {dlpack::kInt, 32, 1};
    case KILN_DTYPE_INT64: return {dlpack::kInt, 64, 1};
    case KILN_DTYPE_FLOAT16: return {dlpack::kFloat, 16, 1};
    case KILN_DTYPE_FLOAT64: return {dlpack::kFloat, 64, 1};
    case KILN_DTYPE_BOOL: return {dlpack::kBool, 8, 1};
    case KILN_DTYPE_BFLOAT16: return {dlpack::kBfloat, 16, 1};
    default: return {dlpack::kFloat, 32, 1};
  }
}

// Converts `dl` into `out` (shape pointing into `dl`); the message names the
// tensor when DLPack describes something this API cannot take.
kiln_status from_dlpack(const MethodState& ms, const char* what, size_t index, const void* dl_tensor,
                        kiln_tensor* out) {
  if (dl_tensor == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where(what, index) + "NULL DLTensor");
  const dlpack::Tensor& dl = *static_cast<const dlpack::Tensor*>(dl_tensor);
  if (dl.ndim < 0 || dl.ndim > KILN_MAX_DIMS || (dl.ndim > 0 && dl.shape == nullptr))
    return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where(what, index) + "DLPack tensor with " + std::to_string(dl.ndim) + " dims");
  out->dtype = to_kiln_dtype(dl.dtype);
  if (out->dtype < 0)
    return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where(what, index) + "DLPack dtype (code " + std::to_string(dl.dtype.code) +
                                                 ", " + std::to_string(dl.dtype.bits) + " bits, " + std::to_string(dl.dtype.lanes) +
                                                 " lanes) has no ExecuTorch equivalent");
  switch (dl.device.device_type) {
    case dlpack::kCPU:
    case dlpack::kCUDAHost: out->device_type = KILN_DEVICE_CPU; break;
    case dlpack::kCUDA:
    case dlpack::kCUDAManaged: out->device_type = KILN_DEVICE_CUDA; break;
    default:
      return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where(what, index) + "DLPack device type " +
                                                   std::to_string(dl.device.device_type) + " is neither the CPU nor CUDA");
  }
  out->device_index = out->device_type == KILN_DEVICE_CUDA ? dl.device.device_id : 0;
  if (dl.strides != nullptr) {
    int64_t expected = 1;
    for (int32_t d = dl.ndim; d-- > 0;) {
      if (dl.shape[d] != 1 && dl.strides[d] != expected)
        return fail(KILN_ERROR_INVALID_ARGUMENT, ms.where(what, index) + "the tensor is not contiguous (strides of a "
                                                     "transposed or sliced view?); pass a contiguous copy");
      expected *= dl.shape[d];
    }
  }
  out->data = static_cast<char*>(dl.data) + dl.byte_offset;
  out->ndim = dl.ndim;
  out->shape = dl.shape;
  return ok();
}

// What a lent output's deleter frees: the DLManagedTensor itself, its shape,
// and a reference on the method (its module, memory and buffers).
struct LentOutput {
  dlpack::ManagedTensor managed;
  std::shared_ptr<MethodState> keep;
  int64_t shape[KILN_MAX_DIMS];
};

void delete_lent_output(dlpack::ManagedTensor* self) {
  delete static_cast<LentOutput*>(self->manager_ctx);
}

}  // namespace
}  // namespace kiln::c_api

using namespace kiln::c_api;  // NOLINT: the C entry points below

extern "C" {

kiln_status kiln_method_set_input_dlpack(kiln_method* method, size_t index, const void* dl_tensor) {
  if (method == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_set_input_dlpack: NULL method");
  kiln_tensor tensor;
  if (kiln_status status = from_dlpack(*method->state, "input", index, dl_tensor, &tensor); status != KILN_OK)
    return status;
  return kiln_method_set_input(method, index, &tensor);
}

kiln_status kiln_method_set_output_dlpack(kiln_method* method, size_t index, const void* dl_tensor) {
  if (method == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_set_output_dlpack: NULL method");
  kiln_tensor tensor;
  if (kiln_status status = from_dlpack(*method->state, "output", index, dl_tensor, &tensor); status != KILN_OK)
    return status;
  return kiln_method_set_output(method, index, &tensor);
}

kiln_status kiln_method_output_dlpack(kiln_method* method, size_t index, void** out) {
  if (method == nullptr || out == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_output_dlpack: NULL argument");
  *out = nullptr;
  kiln_tensor view;
  if (kiln_status status = kiln_method_output(method, index, &view); status != KILN_OK) return status;
  auto* lent = new (std::nothrow) LentOutput();
  if (lent == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "out of memory");
  lent->keep = method->state;
  for (int32_t d = 0; d < view.ndim; ++d) lent->shape[d] = view.shape[d];
  dlpack::Tensor& t = lent->managed.dl_tensor;
  t.data = view.data;
  t.device = {view.device_type == KILN_DEVICE_CUDA ? dlpack::kCUDA : dlpack::kCPU,
              view.device_type == KILN_DEVICE_CUDA ? view.device_index : 0};
  t.ndim = view.ndim;
  t.dtype = to_dl_dtype(view.dtype);
  t.shape = lent->shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  lent->managed.manager_ctx = lent;
  lent->managed.deleter = delete_lent_output;
  *out = &lent->managed;
  return ok();
}

void kiln_dlpack_delete(void* managed_tensor) {
  auto* managed = static_cast<dlpack::ManagedTensor*>(managed_tensor);
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}

}  // extern "C"
