// validate_engine: the structural rules every engine obeys, checked before
// writing (so a bad engine is never written) and after parsing (so the runtime
// can index without further checks). Errors are kInvalidArgument and name the
// tensor / step / module; parse_engine re-labels them kCorruptData. Tensors,
// io and modules are checked here; each step by its kind's registered
// validator (step_format.h, steps/*_step_format.cpp).
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
#include "engine_format/step_format.h"

namespace kiln::engine {
namespace {

constexpr uint64_t kWeightAlignment = 256;
constexpr size_t kMaxNamedWeightKey = 256;

class Validator {
 public:
  explicit Validator(const EngineDesc& desc) : desc_(desc) {}

  Status run() {
    KILN_RETURN_IF_ERROR(check_counts());
    KILN_RETURN_IF_ERROR(check_metadata());
    KILN_RETURN_IF_ERROR(check_named_weights());
    KILN_RETURN_IF_ERROR(check_states());
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
  // "step 3 (gemm 'addmm')"; only for steps of a registered kind.
  std::string step_label(uint32_t i) const {
    const Step& s = desc_.steps[i];
    return "step " + std::to_string(i) + " (" + find_step_format(s.kind)->name + " '" + s.label +
           "')";
  }

  Status check_counts() const {
    // Every list is stored with a u32 count; tensor indices must also stay
    // below kNoTensor.
    constexpr size_t kMax = std::numeric_limits<uint32_t>::max();
    if (desc_.tensors.size() >= kMax || desc_.inputs.size() > kMax ||
        desc_.outputs.size() > kMax || desc_.modules.size() > kMax || desc_.named_weights.size() > kMax ||
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

  // Keys are what the runtime shares by: each appears once, printable, and
  // short enough for a log line.
  Status check_named_weights() const {
    std::unordered_set<std::string_view> keys;
    for (size_t i = 0; i < desc_.named_weights.size(); ++i) {
      const NamedWeight& n = desc_.named_weights[i];
      if (n.key.empty() || n.key.size() > kMaxNamedWeightKey)
        return invalid("named weight %zu: key length %zu is not in [1, %zu]", i, n.key.size(),
                       kMaxNamedWeightKey);
      for (char c : n.key)
        if (c < 0x21 || c > 0x7e)
          return invalid("named weight %zu: key has a byte 0x%02x that is not printable ASCII", i,
                         static_cast<unsigned>(static_cast<unsigned char>(c)));
      if (n.nbytes == 0) return invalid("named weight %zu '%s': 0 bytes", i, n.key.c_str());
      if (!keys.insert(n.key).second)
        return invalid("named weight key '%s' appears more than once", n.key.c_str());
    }
    return Status::ok();
  }

  Status check_states() const {
    std::unordered_set<std::string_view> keys;
    for (size_t i = 0; i < desc_.states.size(); ++i) {
      const StateDesc& s = desc_.states[i];
      if (s.key.empty() || s.key.size() > kMaxNamedWeightKey)
        return invalid("state %zu: key length %zu is not in [1, %zu]", i, s.key.size(), kMaxNamedWeightKey);
      for (char c : s.key)
        if (c < 0x21 || c > 0x7e)
          return invalid("state %zu: key has a byte 0x%02x that is not printable ASCII", i,
                         static_cast<unsigned>(static_cast<unsigned char>(c)));
      if (s.nbytes == 0) return invalid("state %zu '%s': 0 bytes", i, s.key.c_str());
      if (!s.init.empty() && s.init.size() != s.nbytes)
        return invalid("state %zu '%s': initial value of %zu bytes for a %llu-byte state", i, s.key.c_str(),
                       s.init.size(), static_cast<unsigned long long>(s.nbytes));
      if (!keys.insert(s.key).second) return invalid("state key '%s' appears more than once", s.key.c_str());
    }
    return Status::ok();
  }

  Status check_tensor(uint32_t i) {
    const TensorDesc& t = desc_.tensors[i];
    std::string label = tensor_label(i);
    if (static_cast<uint8_t>(t.dtype) >= kDTypeCount)
      return invalid("%s: dtype %u out of range", label.c_str(),
                     static_cast<unsigned>(t.dtype));
    if (static_cast<uint8_t>(t.storage) >= kStorageKindCount)
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
      case StorageKind::kState: {
        if (t.io_index >= desc_.states.size())
          return invalid("%s: state %u out of range (engine has %zu)", label.c_str(), t.io_index,
                         desc_.states.size());
        const StateDesc& s = desc_.states[t.io_index];
        if (!checked_add(t.offset, t.nbytes, &end) || end > s.nbytes)
          return invalid("%s: range [%llu, +%llu) lies outside the %llu-byte state '%s'", label.c_str(),
                         static_cast<unsigned long long>(t.offset), static_cast<unsigned long long>(t.nbytes),
                         static_cast<unsigned long long>(s.nbytes), s.key.c_str());
        break;
      }
      case StorageKind::kNamedWeight: {
        if (t.io_index >= desc_.named_weights.size())
          return invalid("%s: named weight %u out of range (engine has %zu)", label.c_str(),
                         t.io_index, desc_.named_weights.size());
        const NamedWeight& n = desc_.named_weights[t.io_index];
        if (!checked_add(t.offset, t.nbytes, &end) || end > n.nbytes)
          return invalid("%s: range [%llu, +%llu) lies outside the %llu-byte named weight '%s'",
                         label.c_str(), static_cast<unsigned long long>(t.offset),
                         static_cast<unsigned long long>(t.nbytes),
                         static_cast<unsigned long long>(n.nbytes), n.key.c_str());
        if (t.offset % kWeightAlignment != 0)
          return invalid("%s: named weight offset %llu is not %llu-byte aligned", label.c_str(),
                         static_cast<unsigned long long>(t.offset),
                         static_cast<unsigned long long>(kWeightAlignment));
        break;
      }
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

  // The step's own rules come from its kind's registration (step_format.h).
  Status check_step(uint32_t i) const {
    const Step& s = desc_.steps[i];
    const StepFormat* format = find_step_format(s.kind);
    if (format == nullptr)
      return invalid("step %u '%s': kind %u out of range", i, s.label.c_str(),
                     static_cast<unsigned>(s.kind));
    return format->validate(StepCheck(desc_, numel_, i, step_label(i)));
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
