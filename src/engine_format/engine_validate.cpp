// validate_engine: the structural rules every engine obeys, checked before
// writing (so a bad engine is never written) and after parsing (so the runtime
// can index without further checks). Errors are kInvalidArgument and name the
// tensor / step / module; parse_engine re-labels them kCorruptData.
//
// All size arithmetic is overflow-checked: shapes and offsets may come from a
// hostile file.
#include <cstdarg>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>

#include "engine_format/byte_io.h"
#include "engine_format/engine_format.h"
#include "engine_format/engine_validate_internal.h"

namespace kiln::engine {
namespace {

// CUDA launch limits common to every supported GPU.
constexpr uint64_t kMaxBlockThreads = 1024;
constexpr uint32_t kMaxBlockDim[3] = {1024, 1024, 64};
constexpr uint32_t kMaxGridDim[3] = {0x7fffffffu, 65535, 65535};
constexpr uint64_t kWeightAlignment = 256;


class Validator {
 public:
  explicit Validator(const EngineDesc& desc) : desc_(desc) {}

  Status run() {
    KILN_RETURN_IF_ERROR(check_counts());
    KILN_RETURN_IF_ERROR(check_metadata());
    numel_.resize(desc_.tensors.size());
    for (uint32_t i = 0; i < desc_.tensors.size(); ++i) KILN_RETURN_IF_ERROR(check_tensor(i));
    KILN_RETURN_IF_ERROR(check_io(desc_.inputs, StorageKind::kInput, "input"));
    KILN_RETURN_IF_ERROR(check_io(desc_.outputs, StorageKind::kOutput, "output"));
    for (uint32_t i = 0; i < desc_.modules.size(); ++i) KILN_RETURN_IF_ERROR(check_module(i));
    for (uint32_t i = 0; i < desc_.steps.size(); ++i) KILN_RETURN_IF_ERROR(check_step(i));
    return Status::ok();
  }

 private:
  // "tensor 3 'x'" for messages.
  std::string tensor_label(uint32_t i) const {
    return "tensor " + std::to_string(i) + " '" + desc_.tensors[i].name + "'";
  }
  std::string step_label(uint32_t i) const {
    const Step& s = desc_.steps[i];
    const char* kind = s.kind == StepKind::kGemm   ? "gemm"
                       : s.kind == StepKind::kConv ? "conv"
                                                   : "kernel";
    return "step " + std::to_string(i) + " (" + kind + " '" + s.label + "')";
  }

  Status check_counts() const {
    // Every list is stored with a u32 count; tensor indices must also stay
    // below kNoTensor.
    constexpr size_t kMax = std::numeric_limits<uint32_t>::max();
    if (desc_.tensors.size() >= kMax || desc_.inputs.size() > kMax ||
        desc_.outputs.size() > kMax || desc_.modules.size() > kMax ||
        desc_.steps.size() > kMax || desc_.metadata.size() > kMax)
      return invalid("engine has too many tensors, io entries, modules, steps or metadata");
    return Status::ok();
  }

  Status check_metadata() const {
    // find_metadata returns the first match, so a duplicate would be silently
    // shadowed. A set, not a pairwise loop: the count may come from a file.
    std::unordered_set<std::string_view> keys;
    for (const auto& kv : desc_.metadata)
      if (!keys.insert(kv.first).second)
        return invalid("metadata key '%s' appears more than once", kv.first.c_str());
    return Status::ok();
  }

  Status check_tensor(uint32_t i) {
    const TensorDesc& t = desc_.tensors[i];
    std::string label = tensor_label(i);
    if (static_cast<uint8_t>(t.dtype) >= kDTypeCount)
      return invalid("%s: dtype %u out of range", label.c_str(),
                     static_cast<unsigned>(t.dtype));
    if (static_cast<uint8_t>(t.storage) > static_cast<uint8_t>(StorageKind::kWeight))
      return invalid("%s: storage kind %u out of range", label.c_str(),
                     static_cast<unsigned>(t.storage));
    if (t.shape.size() > kMaxRank)
      return invalid("%s: rank %zu exceeds the maximum %u", label.c_str(), t.shape.size(),
                     kMaxRank);
    int64_t numel = 1;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (t.shape[d] < 0)
        return invalid("%s: shape dim %zu is negative (%lld)", label.c_str(), d,
                       static_cast<long long>(t.shape[d]));
      if (!checked_mul(numel, t.shape[d], &numel))
        return invalid("%s: element count overflows int64", label.c_str());
    }
    numel_[i] = numel;
    uint64_t expected = 0;
    if (!checked_mul(static_cast<uint64_t>(numel), dtype_size(t.dtype), &expected))
      return invalid("%s: byte size overflows uint64", label.c_str());
    if (t.nbytes != expected)
      return invalid("%s: nbytes %llu does not match shape (%lld elements of %s = %llu bytes)",
                     label.c_str(), static_cast<unsigned long long>(t.nbytes),
                     static_cast<long long>(numel), dtype_name(t.dtype),
                     static_cast<unsigned long long>(expected));

    uint64_t end = 0;
    switch (t.storage) {
      case StorageKind::kInput:
      case StorageKind::kOutput: {
        bool is_input = t.storage == StorageKind::kInput;
        const auto& list = is_input ? desc_.inputs : desc_.outputs;
        const char* what = is_input ? "input" : "output";
        if (t.io_index >= list.size())
          return invalid("%s: %s index %u out of range (engine has %zu %ss)", label.c_str(),
                         what, t.io_index, list.size(), what);
        if (list[t.io_index] != i)
          return invalid("%s: claims %s %u, but %s %u is tensor %u", label.c_str(), what,
                         t.io_index, what, t.io_index, list[t.io_index]);
        break;
      }
      case StorageKind::kArena:
        if (!checked_add(t.offset, t.nbytes, &end) || end > desc_.arena_bytes)
          return invalid("%s: arena range [%llu, +%llu) lies outside the %llu-byte arena",
                         label.c_str(), static_cast<unsigned long long>(t.offset),
                         static_cast<unsigned long long>(t.nbytes),
                         static_cast<unsigned long long>(desc_.arena_bytes));
        break;
      case StorageKind::kWeight:
        if (!checked_add(t.offset, t.nbytes, &end) || end > desc_.weights.size())
          return invalid("%s: weights range [%llu, +%llu) lies outside the %zu-byte weights",
                         label.c_str(), static_cast<unsigned long long>(t.offset),
                         static_cast<unsigned long long>(t.nbytes), desc_.weights.size());
        // The runtime uploads weights to a 256-byte aligned buffer and hands
        // out pointers into it; vectorized kernels rely on that alignment.
        if (t.offset % kWeightAlignment != 0)
          return invalid("%s: weights offset %llu is not %llu-byte aligned", label.c_str(),
                         static_cast<unsigned long long>(t.offset),
                         static_cast<unsigned long long>(kWeightAlignment));
        break;
    }
    return Status::ok();
  }

  Status check_io(const std::vector<uint32_t>& list, StorageKind storage, const char* what) {
    for (uint32_t i = 0; i < list.size(); ++i) {
      uint32_t t = list[i];
      if (t >= desc_.tensors.size())
        return invalid("%s %u: tensor %u out of range (engine has %zu tensors)", what, i, t,
                       desc_.tensors.size());
      const TensorDesc& td = desc_.tensors[t];
      if (td.storage != storage || td.io_index != i)
        return invalid("%s %u: %s is not %s %u (storage %u, io_index %u)", what, i,
                       tensor_label(t).c_str(), what, i, static_cast<unsigned>(td.storage),
                       td.io_index);
    }
    return Status::ok();
  }

  Status check_module(uint32_t i) const {
    const KernelModule& m = desc_.modules[i];
    std::string label = "module " + std::to_string(i) + " '" + m.name + "'";
    if (m.cubins.empty() && m.ptx.empty())
      return invalid("%s: has neither a cubin nor PTX", label.c_str());
    if (!m.ptx.empty() && m.ptx_sm == 0)
      return invalid("%s: has PTX but no ptx_sm", label.c_str());
    std::set<uint32_t> sms;
    for (size_t c = 0; c < m.cubins.size(); ++c) {
      if (m.cubins[c].sm == 0 || m.cubins[c].image.empty())
        return invalid("%s: cubin %zu has no SM or an empty image", label.c_str(), c);
      if (!sms.insert(m.cubins[c].sm).second)
        return invalid("%s: two cubins for sm_%u", label.c_str(), m.cubins[c].sm);
    }
    return Status::ok();
  }

  // Checks that `index` names a tensor; `role` is e.g. "gemm a".
  Status check_tensor_ref(uint32_t step, const char* role, uint32_t index) const {
    if (index >= desc_.tensors.size())
      return invalid("%s: %s tensor %u out of range (engine has %zu tensors)",
                     step_label(step).c_str(), role, index, desc_.tensors.size());
    return Status::ok();
  }

  // Checks numel(tensor) == rows * cols and, where the shape has a last dim,
  // that it equals `cols` (row-major [..., cols] with the leading dims
  // flattened into rows).
  Status check_matrix(uint32_t step, const char* role, uint32_t index, int64_t rows,
                      int64_t cols, bool check_last_dim) const {
    int64_t expected = 0;
    if (!checked_mul(rows, cols, &expected))
      return invalid("%s: %s element count overflows int64", step_label(step).c_str(), role);
    const TensorDesc& t = desc_.tensors[index];
    bool last_ok = !check_last_dim || t.shape.empty() || t.shape.back() == cols;
    if (numel_[index] != expected || !last_ok)
      return invalid("%s: %s %s has %lld elements (last dim %lld), expected [%lld, %lld]",
                     step_label(step).c_str(), role, tensor_label(index).c_str(),
                     static_cast<long long>(numel_[index]),
                     static_cast<long long>(t.shape.empty() ? 1 : t.shape.back()),
                     static_cast<long long>(rows), static_cast<long long>(cols));
    return Status::ok();
  }

  // Batched form of check_matrix: `batch` matrices of rows x cols, matrix j
  // starting j * stride elements into the tensor (stride 0 broadcasts one
  // matrix). Every matrix the strides reach must lie inside the tensor.
  Status check_batched_matrix(uint32_t step, const char* role, uint32_t index, int64_t rows,
                              int64_t cols, int64_t batch, int64_t stride) const {
    if (batch == 1) return check_matrix(step, role, index, rows, cols, true);
    int64_t one = 0, offset = 0, span = 0;
    if (!checked_mul(rows, cols, &one) || !checked_mul(batch - 1, stride, &offset) ||
        __builtin_add_overflow(offset, one, &span))
      return invalid("%s: %s extent (batch %lld, stride %lld) overflows int64",
                     step_label(step).c_str(), role, static_cast<long long>(batch),
                     static_cast<long long>(stride));
    const TensorDesc& t = desc_.tensors[index];
    if (span > numel_[index])
      return invalid("%s: %s %s has %lld elements, but %lld matrices of [%lld, %lld] %lld "
                     "elements apart reach %lld",
                     step_label(step).c_str(), role, tensor_label(index).c_str(),
                     static_cast<long long>(numel_[index]), static_cast<long long>(batch),
                     static_cast<long long>(rows), static_cast<long long>(cols),
                     static_cast<long long>(stride), static_cast<long long>(span));
    if (!t.shape.empty() && t.shape.back() != cols)
      return invalid("%s: %s %s has last dim %lld, expected %lld", step_label(step).c_str(), role,
                     tensor_label(index).c_str(), static_cast<long long>(t.shape.back()),
                     static_cast<long long>(cols));
    return Status::ok();
  }

  // batch / stride_* consistency, before the operands are measured with them.
  Status check_gemm_batch(uint32_t i) const {
    const GemmStep& g = desc_.steps[i].gemm;
    std::string label = step_label(i);
    // cuBLASLt takes the batch count as an int32.
    if (g.batch < 1 || g.batch > std::numeric_limits<int32_t>::max())
      return invalid("%s: batch %lld must be 1..%d", label.c_str(),
                     static_cast<long long>(g.batch), std::numeric_limits<int32_t>::max());
    const std::pair<const char*, int64_t> strides[] = {{"stride_a", g.stride_a},
                                                       {"stride_b", g.stride_b},
                                                       {"stride_c", g.stride_c},
                                                       {"stride_out", g.stride_out}};
    for (const auto& st : strides) {
      if (g.batch == 1 && st.second != 0)
        return invalid("%s: %s is %lld but batch is 1 (strides must be 0 then)", label.c_str(),
                       st.first, static_cast<long long>(st.second));
      if (st.second < 0)
        return invalid("%s: %s %lld is negative", label.c_str(), st.first,
                       static_cast<long long>(st.second));
    }
    if (g.batch > 1) {
      // Output matrices must not overlap: they are written concurrently.
      int64_t one = 0;
      if (!checked_mul(g.m, g.n, &one) || g.stride_out < one)
        return invalid("%s: stride_out %lld is smaller than one [%lld, %lld] output matrix "
                       "(outputs would overlap)",
                       label.c_str(), static_cast<long long>(g.stride_out),
                       static_cast<long long>(g.m), static_cast<long long>(g.n));
      if (g.c == kNoTensor && g.stride_c != 0)
        return invalid("%s: stride_c %lld set but there is no c", label.c_str(),
                       static_cast<long long>(g.stride_c));
    }
    return Status::ok();
  }

  Status check_gemm(uint32_t i) const {
    const GemmStep& g = desc_.steps[i].gemm;
    std::string label = step_label(i);
    if (static_cast<uint8_t>(g.epilogue) > static_cast<uint8_t>(GemmEpilogue::kRelu))
      return invalid("%s: epilogue %u out of range", label.c_str(),
                     static_cast<unsigned>(g.epilogue));
    if (g.m <= 0 || g.n <= 0 || g.k <= 0)
      return invalid("%s: dims m=%lld n=%lld k=%lld must be positive", label.c_str(),
                     static_cast<long long>(g.m), static_cast<long long>(g.n),
                     static_cast<long long>(g.k));
    bool uses_bias = g.epilogue == GemmEpilogue::kBias || g.epilogue == GemmEpilogue::kReluBias;
    if (uses_bias && g.bias == kNoTensor)
      return invalid("%s: epilogue needs a bias tensor", label.c_str());
    if (!uses_bias && g.bias != kNoTensor)
      return invalid("%s: bias tensor %u set but the epilogue does not use it", label.c_str(),
                     g.bias);

    KILN_RETURN_IF_ERROR(check_tensor_ref(i, "gemm a", g.a));
    KILN_RETURN_IF_ERROR(check_tensor_ref(i, "gemm b", g.b));
    KILN_RETURN_IF_ERROR(check_tensor_ref(i, "gemm out", g.out));
    if (uses_bias) KILN_RETURN_IF_ERROR(check_tensor_ref(i, "gemm bias", g.bias));
    if (g.c != kNoTensor) KILN_RETURN_IF_ERROR(check_tensor_ref(i, "gemm c", g.c));

    KILN_RETURN_IF_ERROR(check_gemm_batch(i));
    const int64_t batch = g.batch;
    KILN_RETURN_IF_ERROR(check_batched_matrix(i, "gemm a", g.a, g.m, g.k, batch, g.stride_a));
    KILN_RETURN_IF_ERROR(
        check_batched_matrix(i, "gemm out", g.out, g.m, g.n, batch, g.stride_out));
    if (g.b_transposed)
      KILN_RETURN_IF_ERROR(check_batched_matrix(i, "gemm b", g.b, g.n, g.k, batch, g.stride_b));
    else
      KILN_RETURN_IF_ERROR(check_batched_matrix(i, "gemm b", g.b, g.k, g.n, batch, g.stride_b));
    // One bias vector serves every batch entry.
    if (uses_bias) KILN_RETURN_IF_ERROR(check_matrix(i, "gemm bias", g.bias, 1, g.n, true));
    if (g.c != kNoTensor)
      KILN_RETURN_IF_ERROR(check_batched_matrix(i, "gemm c", g.c, g.m, g.n, batch, g.stride_c));

    DType dtype = desc_.tensors[g.a].dtype;
    const std::pair<const char*, uint32_t> operands[] = {
        {"b", g.b}, {"out", g.out}, {"bias", uses_bias ? g.bias : kNoTensor}, {"c", g.c}};
    for (const auto& op : operands) {
      if (op.second == kNoTensor) continue;
      DType other = desc_.tensors[op.second].dtype;
      if (other != dtype)
        return invalid("%s: gemm %s %s is %s but a is %s", label.c_str(), op.first,
                       tensor_label(op.second).c_str(), dtype_name(other), dtype_name(dtype));
    }
    if (desc_.tensors[g.out].storage == StorageKind::kWeight)
      return invalid("%s: gemm out %s is a weight", label.c_str(),
                     tensor_label(g.out).c_str());
    return Status::ok();
  }

  Status check_kernel(uint32_t i) const {
    const KernelStep& k = desc_.steps[i].kernel;
    std::string label = step_label(i);
    if (k.module >= desc_.modules.size())
      return invalid("%s: module %u out of range (engine has %zu modules)", label.c_str(),
                     k.module, desc_.modules.size());
    if (k.function.empty()) return invalid("%s: empty function name", label.c_str());
    uint64_t threads = 1;
    for (int d = 0; d < 3; ++d) {
      if (k.grid[d] == 0 || k.grid[d] > kMaxGridDim[d])
        return invalid("%s: grid dim %d is %u (must be 1..%u)", label.c_str(), d, k.grid[d],
                       kMaxGridDim[d]);
      if (k.block[d] == 0 || k.block[d] > kMaxBlockDim[d])
        return invalid("%s: block dim %d is %u (must be 1..%u)", label.c_str(), d, k.block[d],
                       kMaxBlockDim[d]);
      threads *= k.block[d];  // each factor <= 1024: cannot overflow
    }
    if (threads > kMaxBlockThreads)
      return invalid("%s: block of %llu threads exceeds %llu", label.c_str(),
                     static_cast<unsigned long long>(threads),
                     static_cast<unsigned long long>(kMaxBlockThreads));
    for (uint32_t a = 0; a < k.args.size(); ++a) {
      const KernelArg& arg = k.args[a];
      if (static_cast<uint8_t>(arg.kind) > static_cast<uint8_t>(KernelArgKind::kFloat32))
        return invalid("%s: arg %u kind %u out of range", label.c_str(), a,
                       static_cast<unsigned>(arg.kind));
      if (arg.kind == KernelArgKind::kTensor && arg.tensor >= desc_.tensors.size())
        return invalid("%s: arg %u tensor %u out of range (engine has %zu tensors)",
                       label.c_str(), a, arg.tensor, desc_.tensors.size());
    }
    return Status::ok();
  }

  Status check_step(uint32_t i) const {
    const Step& s = desc_.steps[i];
    if (s.kind == StepKind::kGemm) return check_gemm(i);
    if (s.kind == StepKind::kKernel) return check_kernel(i);
    if (s.kind == StepKind::kConv) return check_conv(desc_, i, step_label(i));
    return invalid("step %u '%s': kind %u out of range", i, s.label.c_str(),
                   static_cast<unsigned>(s.kind));
  }

  const EngineDesc& desc_;
  std::vector<int64_t> numel_;  // per tensor, filled by check_tensor
};

}  // namespace

Status invalid(const char* format, ...) {
  va_list args;
  va_start(args, format);
  char buffer[512];
  int n = std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  return Status(StatusCode::kInvalidArgument, n < 0 ? std::string("invalid engine") : buffer);
}

Status validate_engine(const EngineDesc& desc) { return Validator(desc).run(); }

}  // namespace kiln::engine
