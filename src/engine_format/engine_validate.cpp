// validate_engine: the structural rules every engine obeys, checked before
// writing (so a bad engine is never written) and after parsing (so the runtime
// can index without further checks). Errors are kInvalidArgument and name the
// tensor / step / module; parse_engine re-labels them kCorruptData. Tensors,
// io and modules are checked here; each step by its kind's registered
// validator (step_format.h, steps/*_step_format.cpp).
//
// All size arithmetic is overflow-checked: shapes and offsets may come from a
// hostile file.
#include <algorithm>
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
#include "engine_format/input_bounds.h"
#include "engine_format/step_format.h"

namespace kiln::engine {
namespace {

constexpr uint64_t kWeightAlignment = 256;
constexpr size_t kMaxNamedWeightKey = 256;
// Derived weights are made at load (cudaMalloc + one copy call per copy), so a corrupt engine
// must not be able to ask for absurd work: the largest model layouts are ~1 GB from ~10^5 copies.
constexpr uint64_t kMaxDerivedWeightBytes = uint64_t{64} << 30;  // per engine, all derived weights
constexpr uint64_t kMaxDerivedCopies = uint64_t{16} << 20;       // per engine, all derived weights
constexpr uint64_t kDerivedAlignment = 16;

class Validator {
 public:
  explicit Validator(const EngineDesc& desc) : desc_(desc) {}

  Status run() {
    KILN_RETURN_IF_ERROR(check_counts());
    KILN_RETURN_IF_ERROR(check_metadata());
    KILN_RETURN_IF_ERROR(check_named_weights());
    KILN_RETURN_IF_ERROR(check_states());
    numel_.resize(desc_.tensors.size());
    KILN_RETURN_IF_ERROR(check_derived_weight_sizes());
    for (uint32_t i = 0; i < desc_.tensors.size(); ++i) KILN_RETURN_IF_ERROR(check_tensor(i));
    for (uint32_t i = 0; i < desc_.derived_weights.size(); ++i) KILN_RETURN_IF_ERROR(check_derived_copies(i));
    KILN_RETURN_IF_ERROR(check_io(desc_.inputs, StorageKind::kInput, "input"));
    KILN_RETURN_IF_ERROR(check_io(desc_.outputs, StorageKind::kOutput, "output"));
    KILN_RETURN_IF_ERROR(check_input_bounds());
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
        desc_.steps.size() > kMax || desc_.metadata.size() > kMax || desc_.states.size() > kMax ||
        desc_.derived_weights.size() > kMax)
      return invalid("engine has too many tensors, io entries, modules, steps, metadata, states or derived weights");
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

  // The index inputs' bounds (input_bounds.h): well formed, and only on integer inputs. After
  // check_io, so each input names a tensor.
  Status check_input_bounds() const {
    const std::string* text = desc_.find_metadata(kInputBoundsKey);
    if (text == nullptr) return Status::ok();
    Result<std::vector<InputBound>> bounds = parse_input_bounds(*text, desc_.inputs.size());
    if (!bounds.is_ok()) return invalid("%s", bounds.status().message().c_str());
    for (const InputBound& b : bounds.value()) {
      const DType d = desc_.tensors[desc_.inputs[b.input]].dtype;
      if (d != DType::kInt64 && d != DType::kInt32)
        return invalid("%s: input %u is %s, not an integer index", kInputBoundsKey, b.input, dtype_name(d));
    }
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

  // "derived weight 2 'layers.packed'" for messages.
  std::string derived_label(size_t i) const {
    return "derived weight " + std::to_string(i) + " '" + desc_.derived_weights[i].name + "'";
  }

  // Names, sizes and copy counts, before any tensor refers to them; the caps bound the work a
  // load does for a (possibly hostile) file.
  Status check_derived_weight_sizes() const {
    uint64_t total_bytes = 0, total_copies = 0;
    for (size_t i = 0; i < desc_.derived_weights.size(); ++i) {
      const DerivedWeight& d = desc_.derived_weights[i];
      if (d.name.empty() || d.name.size() > kMaxNamedWeightKey)
        return invalid("derived weight %zu: name length %zu is not in [1, %zu]", i, d.name.size(),
                       kMaxNamedWeightKey);
      for (char c : d.name)
        if (c < 0x20 || c > 0x7e)
          return invalid("derived weight %zu: name has a byte 0x%02x that is not printable ASCII", i,
                         static_cast<unsigned>(static_cast<unsigned char>(c)));
      const std::string label = derived_label(i);
      if (d.nbytes == 0) return invalid("%s: 0 bytes", label.c_str());
      total_bytes += std::min(d.nbytes, kMaxDerivedWeightBytes + 1);  // cannot overflow: count < 2^32
      total_copies += d.copies.size();
      if (total_bytes > kMaxDerivedWeightBytes)
        return invalid("%s: %llu bytes brings the engine's derived weights past the %llu-byte limit",
                       label.c_str(), static_cast<unsigned long long>(d.nbytes),
                       static_cast<unsigned long long>(kMaxDerivedWeightBytes));
      if (total_copies > kMaxDerivedCopies)
        return invalid("%s: %zu copies bring the engine's derived weights past the limit of %llu copies",
                       label.c_str(), d.copies.size(), static_cast<unsigned long long>(kMaxDerivedCopies));
    }
    return Status::ok();
  }

  // Each copy reads inside an inline or named weight tensor and writes inside its derived
  // weight, in 16-byte units (after check_tensor: the sources' sizes are proven). Messages are
  // built only on failure: a model has ~10^5 copies.
  Status check_derived_copies(size_t i) const {
    const DerivedWeight& d = desc_.derived_weights[i];
    for (size_t c = 0; c < d.copies.size(); ++c) {
      const DerivedCopy& copy = d.copies[c];
      auto where = [&] { return derived_label(i) + " copy " + std::to_string(c); };
      if (copy.source >= desc_.tensors.size())
        return invalid("%s: source tensor %u out of range (engine has %zu tensors)", where().c_str(), copy.source,
                       desc_.tensors.size());
      const TensorDesc& src = desc_.tensors[copy.source];
      if (src.storage != StorageKind::kWeight && src.storage != StorageKind::kNamedWeight)
        return invalid("%s: source %s has storage kind %u; expected an inline (3) or named (4) weight",
                       where().c_str(), tensor_label(copy.source).c_str(), static_cast<unsigned>(src.storage));
      if (copy.rows == 0) return invalid("%s: 0 rows; expected at least 1", where().c_str());
      if (copy.row_bytes < kDerivedAlignment)
        return invalid("%s: row_bytes %u; expected at least %llu", where().c_str(), copy.row_bytes,
                       static_cast<unsigned long long>(kDerivedAlignment));
      if ((copy.offset | copy.stride | copy.dst | copy.row_bytes) % kDerivedAlignment != 0) {
        const struct {
          const char* name;
          uint64_t value;
        } units[] = {{"offset", copy.offset}, {"stride", copy.stride}, {"dst", copy.dst}, {"row_bytes", copy.row_bytes}};
        for (const auto& u : units)
          if (u.value % kDerivedAlignment != 0)
            return invalid("%s: %s %llu is not a multiple of %llu bytes", where().c_str(), u.name,
                           static_cast<unsigned long long>(u.value),
                           static_cast<unsigned long long>(kDerivedAlignment));
      }
      if (copy.rows > 1 && copy.stride < copy.row_bytes)
        return invalid("%s: stride %llu is less than row_bytes %u (source rows may not overlap)", where().c_str(),
                       static_cast<unsigned long long>(copy.stride), copy.row_bytes);
      // Source: offset + (rows - 1) * stride + row_bytes <= the tensor's bytes.
      uint64_t span = 0, end = 0;
      if (!checked_mul(static_cast<uint64_t>(copy.rows - 1), copy.stride, &span) ||
          !checked_add(copy.offset, span, &end) || !checked_add(end, uint64_t{copy.row_bytes}, &end) ||
          end > src.nbytes)
        return invalid("%s: reads %u rows of %u bytes, %llu apart, from offset %llu of source %s: expected "
                       "them within its %llu bytes",
                       where().c_str(), copy.rows, copy.row_bytes, static_cast<unsigned long long>(copy.stride),
                       static_cast<unsigned long long>(copy.offset), tensor_label(copy.source).c_str(),
                       static_cast<unsigned long long>(src.nbytes));
      // Destination: dst + rows * row_bytes <= nbytes (the product of two u32 fits in 64 bits).
      const uint64_t bytes = uint64_t{copy.rows} * copy.row_bytes;
      if (!checked_add(copy.dst, bytes, &end) || end > d.nbytes)
        return invalid("%s: writes [%llu, +%llu): expected it within the %llu-byte derived weight",
                       where().c_str(), static_cast<unsigned long long>(copy.dst),
                       static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(d.nbytes));
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
      case StorageKind::kDerivedWeight: {
        if (t.io_index >= desc_.derived_weights.size())
          return invalid("%s: derived weight %u out of range (engine has %zu)", label.c_str(), t.io_index,
                         desc_.derived_weights.size());
        const DerivedWeight& d = desc_.derived_weights[t.io_index];
        if (!checked_add(t.offset, t.nbytes, &end) || end > d.nbytes)
          return invalid("%s: range [%llu, +%llu) lies outside the %llu-byte %s", label.c_str(),
                         static_cast<unsigned long long>(t.offset), static_cast<unsigned long long>(t.nbytes),
                         static_cast<unsigned long long>(d.nbytes), derived_label(t.io_index).c_str());
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
