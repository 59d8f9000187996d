/* Kiln's C API: run a Kiln .pte (an ExecuTorch program whose subgraphs are
 * Kiln GPU engines) from any language that can call C, with no libtorch and
 * no Python. libkiln_c_api.so holds ExecuTorch's Module, the Kiln delegate
 * (registered when the library loads) and ExecuTorch's CPU kernels for ops
 * left outside delegates.
 *
 * Conventions:
 *  - Every function returns a kiln_status; KILN_OK is 0. On any other status
 *    kiln_last_error() says what was wrong, naming the method and tensor and
 *    what was expected against what was given. Nothing throws or aborts
 *    across this boundary.
 *  - Handles are opaque. A program owns its methods' metadata; a method handle
 *    keeps its program alive (destroying the program handle first is allowed).
 *  - A method handle is used by one thread at a time (the caller serializes);
 *    different method handles may run on different threads.
 *  - Tensors are dense, row-major (C-contiguous) and described by
 *    kiln_tensor: dtype codes are ExecuTorch's ScalarType numbers.
 */
#ifndef KILN_C_API_H_
#define KILN_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KILN_C_API __attribute__((visibility("default")))
#else
#define KILN_C_API
#endif

/* Version of this interface; bumped when a declaration changes. */
#define KILN_C_API_VERSION 1

typedef enum {
  KILN_OK = 0,
  KILN_ERROR_INVALID_ARGUMENT = 1, /* a null pointer, bad index, wrong tensor */
  KILN_ERROR_NOT_FOUND = 2,        /* no such file or method */
  KILN_ERROR_LOAD = 3,             /* the program or method cannot be loaded */
  KILN_ERROR_NO_GPU = 4,           /* the method needs a CUDA GPU and there is none */
  KILN_ERROR_EXECUTE = 5,          /* ExecuTorch or the delegate failed to run */
  KILN_ERROR_CUDA = 6,             /* a CUDA call failed (the message names it) */
  KILN_ERROR_NOT_SUPPORTED = 7     /* e.g. a non-tensor input or output */
} kiln_status;

/* ExecuTorch ScalarType numbers (the ones a Kiln engine takes, and any other
 * standard one a CPU op may use). */
typedef enum {
  KILN_DTYPE_UINT8 = 0,
  KILN_DTYPE_INT8 = 1,
  KILN_DTYPE_INT16 = 2,
  KILN_DTYPE_INT32 = 3,
  KILN_DTYPE_INT64 = 4,
  KILN_DTYPE_FLOAT16 = 5,
  KILN_DTYPE_FLOAT32 = 6,
  KILN_DTYPE_FLOAT64 = 7,
  KILN_DTYPE_BOOL = 11,
  KILN_DTYPE_BFLOAT16 = 15
} kiln_dtype;

typedef enum { KILN_DEVICE_CPU = 0, KILN_DEVICE_CUDA = 1 } kiln_device_type;

#define KILN_MAX_DIMS 16

/* A dense row-major tensor: `data` is host memory (KILN_DEVICE_CPU) or CUDA
 * device memory on device `device_index` (KILN_DEVICE_CUDA). `shape` holds
 * `ndim` sizes. Given to the library, nothing is owned or kept past the call
 * that takes it, except where that call says so. */
typedef struct {
  void* data;
  int32_t dtype;        /* kiln_dtype */
  int32_t device_type;  /* kiln_device_type */
  int32_t device_index;
  int32_t ndim;
  const int64_t* shape;
} kiln_tensor;

/* What a method's signature says about one input or output. `shape` points
 * into the method handle and lives as long as it. `device_type` is where the
 * program expects the tensor: KILN_DEVICE_CUDA for device-resident I/O
 * (kiln.save with ExecuTorch's device-resident config). `is_tensor` is 0 for
 * a non-tensor value (an int, a bool...), which this API does not feed. */
typedef struct {
  int32_t is_tensor;
  int32_t dtype;
  int32_t device_type;
  int32_t device_index;
  int32_t ndim;
  const int64_t* shape;
  size_t nbytes;
} kiln_tensor_info;

typedef struct kiln_program kiln_program;
typedef struct kiln_method kiln_method;

/* The message of the last failing call on this thread ("" if none). Valid
 * until the next call into this library on this thread. */
KILN_C_API const char* kiln_last_error(void);

/* The name of a kiln_dtype ("float32", ...), "unknown" for other values. */
KILN_C_API const char* kiln_dtype_name(int32_t dtype);

/* Whether the Kiln delegate can run here: 1 when it reports a usable CUDA GPU,
 * else 0 with *reason (may be NULL) pointing at why, e.g. "no NVIDIA driver:
 * libcuda.so.1 cannot be loaded (...)" (a static string of this library). */
KILN_C_API int kiln_gpu_available(const char** reason);

/* Loads a .pte (memory-mapped; every flatbuffer offset verified, so a damaged
 * file is refused, not crashed on). `data_path` is the .ptd holding the weights
 * of a program saved with external weights, or NULL. Loading the program
 * needs no GPU; loading a method that uses Kiln engines does. On success
 * *out is a new handle for kiln_program_destroy. */
KILN_C_API kiln_status kiln_program_load(const char* path, const char* data_path,
                                         kiln_program** out);
/* Releases the handle (NULL is ignored). Method handles keep working. */
KILN_C_API void kiln_program_destroy(kiln_program* program);

/* The state scope of the program's methods loaded after this call ("" by
 * default): the mutable state of a program (a language model's KV cache) is
 * one buffer per GPU, model and scope, so programs of one model loaded in the
 * same scope share one cache, and loads in different scopes (two concurrent
 * generations) each get their own. Weights are shared either way. At most 255
 * printable ASCII characters. KILN_ERROR_INVALID_ARGUMENT for another text, or
 * once a method of this program is loaded (its scope is fixed). */
KILN_C_API kiln_status kiln_program_set_state_scope(kiln_program* program, const char* scope);

/* Method names, sorted; the string lives as long as the program handle. */
KILN_C_API kiln_status kiln_program_num_methods(const kiln_program* program, size_t* out);
KILN_C_API kiln_status kiln_program_method_name(const kiln_program* program, size_t index,
                                                const char** out);

/* A handle on method `name` with its metadata; nothing is loaded yet (see
 * kiln_method_load), so this works without a GPU. */
KILN_C_API kiln_status kiln_method_open(kiln_program* program, const char* name,
                                        kiln_method** out);
KILN_C_API void kiln_method_destroy(kiln_method* method);

KILN_C_API kiln_status kiln_method_num_inputs(const kiln_method* method, size_t* out);
KILN_C_API kiln_status kiln_method_num_outputs(const kiln_method* method, size_t* out);
KILN_C_API kiln_status kiln_method_input_info(const kiln_method* method, size_t index,
                                              kiln_tensor_info* out);
KILN_C_API kiln_status kiln_method_output_info(const kiln_method* method, size_t index,
                                               kiln_tensor_info* out);
/* 1 when the method has Kiln delegates (and so needs a GPU), else 0. */
KILN_C_API int kiln_method_uses_kiln(const kiln_method* method);

/* Loads the method: the Kiln engines are initialized (weights uploaded,
 * kernels loaded) and, for outputs the program leaves to the caller
 * (device-resident I/O), one CUDA buffer per output is allocated. Idempotent;
 * kiln_method_execute calls it when needed. KILN_ERROR_NO_GPU when the
 * method uses Kiln and there is no usable GPU. */
KILN_C_API kiln_status kiln_method_load(kiln_method* method);

/* Sets input `index`. The tensor must match the method's dtype, rank and
 * device exactly; each dim may be smaller than the signature's (a program
 * exported with dynamic shapes plans its inputs at their largest size; a
 * static program refuses a smaller one when it is set). Host data is copied into the method's memory now when the
 * program plans memory for the input, otherwise (device-resident inputs) the
 * pointer itself is used: the memory must stay valid until
 * kiln_method_execute returns. CUDA pointers must be 256-byte aligned (the
 * alignment of cudaMalloc). */
KILN_C_API kiln_status kiln_method_set_input(kiln_method* method, size_t index,
                                             const kiln_tensor* tensor);

/* For an output the program leaves to the caller (device-resident I/O): makes
 * the next executions write output `index` into `tensor`'s memory (same rules
 * as inputs) instead of the method's own buffer; NULL returns to the method's
 * own buffer (for an output the program places itself, NULL does nothing).
 * KILN_ERROR_INVALID_ARGUMENT for a tensor given for an output the program
 * places itself. */
KILN_C_API kiln_status kiln_method_set_output(kiln_method* method, size_t index,
                                              const kiln_tensor* tensor);

/* Runs the method on the inputs set (every input must have been set since
 * the method was loaded). Returns when the outputs are complete: host outputs
 * are in host memory and device outputs' work is finished
 * (cudaStreamPerThread is synchronized), so any stream may read them. */
KILN_C_API kiln_status kiln_method_execute(kiln_method* method);

/* Output `index` of the last execution: where it is (host or CUDA memory),
 * its dtype and shape. The memory belongs to the method (or to the caller, see
 * kiln_method_set_output) and is overwritten by the next execution; `shape`
 * lives as long as the method handle. */
KILN_C_API kiln_status kiln_method_output(const kiln_method* method, size_t index,
                                          kiln_tensor* out);

/* Copies output `index` of the last execution to host memory `dst` of
 * `nbytes` bytes (exactly the output's size), from host or device. */
KILN_C_API kiln_status kiln_method_copy_output(const kiln_method* method, size_t index,
                                               void* dst, size_t nbytes);

/* DLPack (https://dmlc.github.io/dlpack/), for bindings that exchange tensors
 * with other libraries without copying. `dl_tensor` points at a DLTensor
 * (DLPack 0.x/1.x ABI; a DLManagedTensor starts with one): it is checked
 * (device, dtype, shape, compact row-major strides) and set like
 * kiln_method_set_input. The caller keeps the DLManagedTensor alive until
 * kiln_method_execute returns and then calls its deleter. */
KILN_C_API kiln_status kiln_method_set_input_dlpack(kiln_method* method, size_t index,
                                                    const void* dl_tensor);
KILN_C_API kiln_status kiln_method_set_output_dlpack(kiln_method* method, size_t index,
                                                     const void* dl_tensor);

/* A new DLManagedTensor (legacy, unversioned ABI) viewing output `index` of
 * the last execution, with no copy. It holds a reference that keeps the
 * method's memory alive until its deleter runs; the data is overwritten by
 * the method's next execution. The caller hands it to a consumer (e.g. in a
 * "dltensor" capsule) or calls kiln_dlpack_delete. */
KILN_C_API kiln_status kiln_method_output_dlpack(kiln_method* method, size_t index, void** out);
/* Calls the deleter of a DLManagedTensor (NULL or a NULL deleter: nothing). */
KILN_C_API void kiln_dlpack_delete(void* managed_tensor);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  /* KILN_C_API_H_ */
