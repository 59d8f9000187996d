// The engine as plain data: what the compiler produces and the runtime
// executes. engine_format.h turns it into bytes and back. Both the export side
// (compiler) and the run side (runtime) include this header, so it holds no
// CUDA types and no ExecuTorch types.
//
// An engine is a launch plan: a list of steps (cuBLASLt GEMMs, cuDNN
// convolutions and generated kernels) over tensors that live in one of these places: an engine input, an
// engine output, the activation arena (one buffer, offsets planned by tensor
// lifetime), the weights blob (uploaded once at load), a named weight: bytes
// kept outside the engine (ExecuTorch named data, in the .pte or a .ptd) under
// a key, uploaded once per process and GPU and shared by every engine naming it,
// a state (mutable, outlives an execution) or a derived weight (made at load from
// the others).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kiln::engine {

// Stable on-disk values: never renumber.
enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kInt64 = 3,
  kInt32 = 4,
  kBool = 5,
};
constexpr uint8_t kDTypeCount = 6;

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "float32", "float16", ...

enum class StorageKind : uint8_t {
  kInput = 0,   // engine input number `io_index`; offset unused
  kOutput = 1,  // engine output number `io_index`; offset unused
  kArena = 2,   // activation arena at `offset`
  kWeight = 3,  // weights blob at `offset`
  kNamedWeight = 4,  // named weight number `io_index` (EngineDesc::named_weights), at `offset`
  kState = 5,        // mutable state number `io_index` (EngineDesc::states), at `offset`
  kDerivedWeight = 6,  // derived weight number `io_index` (EngineDesc::derived_weights), at `offset`
};
constexpr uint8_t kStorageKindCount = 7;

// Weights live in the blob, in named data or are made from those at load; all are read-only to
// steps.
inline bool is_weight(StorageKind kind) {
  return kind == StorageKind::kWeight || kind == StorageKind::kNamedWeight || kind == StorageKind::kDerivedWeight;
}

constexpr uint32_t kMaxRank = 8;
constexpr uint32_t kNoTensor = 0xffffffffu;

struct TensorDesc {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // static, contiguous row-major
  StorageKind storage = StorageKind::kArena;
  uint32_t io_index = 0;  // for kInput / kOutput; the named weight, state or derived weight
  uint64_t offset = 0;    // byte offset for kArena / kWeight / kNamedWeight / kState / kDerivedWeight
  uint64_t nbytes = 0;    // product(shape) * dtype_size(dtype)
};

// One NVRTC compilation unit: machine code for each target SM plus PTX that
// the driver can JIT for newer GPUs.
struct CubinImage {
  uint32_t sm = 0;  // e.g. 87, 90
  std::vector<uint8_t> image;
};

struct KernelModule {
  std::string name;
  std::vector<CubinImage> cubins;
  std::string ptx;       // may be empty when PTX was not requested
  uint32_t ptx_sm = 0;   // virtual arch the PTX targets (compute_XX)
  std::string source;    // CUDA source, kept for `kiln inspect` and debugging
};

// Stable on-disk values.
enum class StepKind : uint8_t { kGemm = 0, kKernel = 1, kConv = 2 };

enum class GemmEpilogue : uint8_t {
  kNone = 0,
  kBias = 1,      // out += bias[n]
  kReluBias = 2,  // out = relu(out + bias[n])
  kRelu = 3,
};

// out[m, n] = alpha * a[m, k] @ B + beta * c (c only when `c` is set),
// with B = b[k, n] (b_transposed == false) or b[n, k]^T (true, nn.Linear's
// weight layout), then the epilogue. All row-major and contiguous. Operands
// share one dtype; accumulation is fp32.
//
// Batched (bmm): `batch` > 1 repeats the product; matrix i of a, b, c and out
// starts stride_* elements after matrix i-1. A stride of 0 broadcasts that
// operand (one weight matrix for every batch entry). With batch == 1 the
// strides are unused and written as 0.
struct GemmStep {
  uint32_t a = kNoTensor;
  uint32_t b = kNoTensor;
  uint32_t bias = kNoTensor;  // [n], used by kBias / kReluBias
  uint32_t c = kNoTensor;     // [m, n] addend scaled by beta (addmm with a full
                              // matrix input); kNoTensor when absent
  uint32_t out = kNoTensor;
  int64_t m = 0, n = 0, k = 0;
  bool b_transposed = false;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  float alpha = 1.0f;
  float beta = 0.0f;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0, stride_out = 0;  // elements
};

// Stable on-disk values.
enum class ConvActivation : uint8_t {
  kNone = 0,
  kRelu = 1,
};

// A 2-D convolution through cuDNN, channels-last (NHWC) throughout:
//   out[n, p, q, k] = act(conv(x, w)[n, p, q, k] + bias[k] + z[n, p, q, k])
// x: [n, h, w, c]; w: [k, r, s, c / groups] (OHWI); bias: [k] or kNoTensor;
// z: [n, p, q, k] residual addend or kNoTensor; out: [n, p, q, k].
// All tensors share one dtype (float32, float16 or bfloat16); cuDNN
// accumulates in fp32. Depthwise is groups == c == k.
// p = (h + 2*pad_h - dilation_h*(r-1) - 1) / stride_h + 1, likewise q.
struct ConvStep {
  uint32_t x = kNoTensor;
  uint32_t w = kNoTensor;
  uint32_t bias = kNoTensor;
  uint32_t z = kNoTensor;
  uint32_t out = kNoTensor;
  int64_t n = 0, h = 0, w_in = 0, c = 0;  // input extents (w_in: input width)
  int64_t k = 0, r = 0, s = 0;            // output channels, filter height/width
  int64_t p = 0, q = 0;                   // output height/width
  int64_t pad_h = 0, pad_w = 0;
  int64_t stride_h = 1, stride_w = 1;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  ConvActivation activation = ConvActivation::kNone;
};

enum class KernelArgKind : uint8_t {
  kTensor = 0,  // device pointer of tensor `tensor`
  kInt64 = 1,
  kFloat32 = 2,
};

struct KernelArg {
  KernelArgKind kind = KernelArgKind::kTensor;
  uint32_t tensor = kNoTensor;
  int64_t i64 = 0;
  float f32 = 0.0f;
};

struct KernelStep {
  uint32_t module = 0;
  std::string function;  // extern "C" name inside the module
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t shared_bytes = 0;
  // 0: the grid is `grid`, as written. > 0: a persistent kernel, whose blocks wait on each other
  // through global memory, so all of them must be resident at once: `grid[0]` is the most blocks
  // it may use (grid[1] == grid[2] == 1) and the runtime launches, at load, the largest count
  // <= grid[0] that is co-resident on the GPU and a multiple of the kernel's compiled cluster
  // size; a GPU where fewer than `min_blocks` fit refuses the engine (kIncompatible). Such a step
  // is never launched early (programmatic stream serialization) even when its module may be.
  uint32_t min_blocks = 0;
  std::vector<KernelArg> args;  // passed in order, each by value
};

struct Step {
  StepKind kind = StepKind::kKernel;
  std::string label;  // the fused op group, e.g. "addmm+gelu"; for inspect/logs
  GemmStep gemm;      // valid when kind == kGemm
  KernelStep kernel;  // valid when kind == kKernel
  ConvStep conv;      // valid when kind == kConv
};

// A weight whose bytes are not in the engine: the runtime asks the program's
// named data (ExecuTorch NamedDataMap) for `key` and checks that exactly
// `nbytes` bytes with hash_bytes() == `hash` came back before using them.
// Keys are made at export (python/kiln/_weights.py): "kiln/<model id>/<hash>",
// unique per model and per content.
struct NamedWeight {
  std::string key;
  uint64_t nbytes = 0;
  uint64_t hash = 0;
};

// A named weight's bytes once they left an engine (externalize_weights), for
// the exporter to store as named data: its key, the first tensor using it.
struct ExternalWeight {
  std::string key, tensor_name;
  std::vector<uint8_t> bytes;
};

// Mutable state that outlives an execution (a KV cache): device memory of
// `nbytes` that the runtime allocates once per (device, scope, key), fills
// with `init` (all zeros when empty) and shares between every engine naming
// the key, such as a program's prefill and decode methods. Steps read it and
// update it in place. Keys are made at export:
// "kiln/<model id>/state/<buffer name>".
struct StateDesc {
  std::string key;
  uint64_t nbytes = 0;
  std::vector<uint8_t> init;  // empty: zeros
};

// A weight made at load from the engine's other weights: a layout one kernel reads faster than
// the model's (the persistent decode kernel's per-block stages, ops/decode_layers_kernel.h), kept
// beside the original so that other steps and methods still read that. `nbytes` of device
// memory, zeroed, then each copy's `rows` rows of `row_bytes` bytes, row r from weight tensor
// `source` at `offset + r * stride` bytes to `dst + r * row_bytes`. Offsets, strides and row
// sizes are multiples of 16 bytes; with more than one row, stride >= row_bytes (source rows do
// not overlap: one cudaMemcpy2D per copy). Offsets are relative to the source tensor, so a
// source that externalize_weights names keeps its copies. The runtime makes it once per engine
// load (private to that Engine) and reports its size.
struct DerivedCopy {
  uint32_t source = kNoTensor;  // a kWeight or kNamedWeight tensor (never derived, never a state)
  uint64_t offset = 0, stride = 0, dst = 0;
  uint32_t rows = 0, row_bytes = 0;
};
struct DerivedWeight {
  std::string name;  // for messages and inspect
  uint64_t nbytes = 0;
  std::vector<DerivedCopy> copies;
};

struct EngineDesc {
  std::vector<TensorDesc> tensors;
  std::vector<uint32_t> inputs;   // tensor indices, in delegate argument order
  std::vector<uint32_t> outputs;  // tensor indices, in delegate output order
  std::vector<KernelModule> modules;
  std::vector<Step> steps;
  uint64_t arena_bytes = 0;
  std::vector<uint8_t> weights;  // constants kept inline; offsets 256-byte aligned
  std::vector<NamedWeight> named_weights;  // constants kept outside (kNamedWeight tensors)
  std::vector<StateDesc> states;           // mutable buffers (kState tensors)
  std::vector<DerivedWeight> derived_weights;  // made at load (kDerivedWeight tensors)
  // Free-form facts for inspect and for options baked in at export, e.g.
  // {"precision", "float16"}, {"target_sms", "87,90"}, {"use_cuda_graphs", "true"}.
  std::vector<std::pair<std::string, std::string>> metadata;

  const std::string* find_metadata(const std::string& key) const {
    for (const auto& kv : metadata)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
};

}  // namespace kiln::engine
