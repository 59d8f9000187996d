#include "program_check.h"

#include <unistd.h>

#include <cinttypes>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

namespace kiln::tools {

std::string check_planned_memory(const executorch::runtime::MethodMeta& meta,
                                 uint64_t limit_bytes) {
  uint64_t total = 0;
  char text[192];
  for (size_t i = 0; i < meta.num_memory_planned_buffers(); ++i) {
    executorch::runtime::Result<int64_t> size = meta.memory_planned_buffer_size(i);
    if (!size.ok()) {
      std::snprintf(text, sizeof(text), "cannot read the size of memory-planned buffer %zu", i);
      return text;
    }
    if (*size < 0 || static_cast<uint64_t>(*size) > limit_bytes - total) {
      std::snprintf(text, sizeof(text),
                    "memory-planned buffer %zu claims %" PRId64 " bytes, more than the %" PRIu64
                    " bytes allowed in all (damaged file?)",
                    i, *size, limit_bytes);
      return text;
    }
    total += static_cast<uint64_t>(*size);
  }
  return "";
}

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return UINT64_MAX;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

}  // namespace kiln::tools

namespace kiln::tools {
namespace {

// A bounds-checked view of a flatbuffer: each accessor returns false instead
// of reading outside [0, size).
class FlatView {
 public:
  FlatView(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool u32(uint64_t at, uint32_t* out) const {
    if (at > size_ || size_ - at < 4) return false;
    *out = static_cast<uint32_t>(data_[at]) | static_cast<uint32_t>(data_[at + 1]) << 8 |
           static_cast<uint32_t>(data_[at + 2]) << 16 | static_cast<uint32_t>(data_[at + 3]) << 24;
    return true;
  }
  size_t size() const { return size_; }
  uint8_t byte(uint64_t at) const { return data_[at]; }  // at < size()
  bool u16(uint64_t at, uint16_t* out) const {
    if (at > size_ || size_ - at < 2) return false;
    *out = static_cast<uint16_t>(data_[at] | data_[at + 1] << 8);
    return true;
  }
  // Follows the uoffset stored at `at`.
  bool deref(uint64_t at, uint64_t* out) const {
    uint32_t offset;
    if (!u32(at, &offset)) return false;
    *out = at + offset;
    return *out < size_;
  }
  // Position of field `index` of the table at `table`; 0 when absent, false
  // when the table or its vtable is out of bounds.
  bool field(uint64_t table, unsigned index, uint64_t* out) const {
    uint32_t soffset;
    if (!u32(table, &soffset)) return false;
    const int64_t vtable = static_cast<int64_t>(table) - static_cast<int32_t>(soffset);
    uint16_t vtable_size, field_offset = 0;
    if (vtable < 0 || !u16(static_cast<uint64_t>(vtable), &vtable_size)) return false;
    const uint64_t slot = 4 + 2ull * index;
    if (slot + 2 <= vtable_size && !u16(static_cast<uint64_t>(vtable) + slot, &field_offset))
      return false;
    *out = field_offset == 0 ? 0 : table + field_offset;
    return true;
  }
  // The referenced object (table, vector, string) of field `index`; *out = 0
  // when the field is absent.
  bool child(uint64_t table, unsigned index, uint64_t* out) const {
    uint64_t at;
    if (!field(table, index, &at)) return false;
    if (at == 0) {
      *out = 0;
      return true;
    }
    return deref(at, out);
  }
  // Length of the vector (or string) at `at`, checked to fit with
  // `element_size`-byte elements (plus a terminator for strings).
  bool length(uint64_t at, uint64_t element_size, uint32_t* out) const {
    if (!u32(at, out)) return false;
    return (size_ - at - 4) / element_size >= *out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

// Field indices in ExecuTorch's schema/program.fbs (1.5.1).
constexpr unsigned kProgramExecutionPlan = 1;
constexpr unsigned kPlanName = 0, kPlanValues = 2, kPlanInputs = 3, kPlanOutputs = 4,
                   kPlanDelegates = 7;
constexpr unsigned kValueType = 0, kValueVal = 1;
constexpr uint8_t kKernelTypesTensor = 5;
constexpr unsigned kTensorScalarType = 0, kTensorSizes = 2, kTensorDimOrder = 3,
                   kTensorExtraInfo = 9;
constexpr unsigned kExtraDeviceType = 3, kExtraDeviceIndex = 4;  // ExtraTensorInfo
constexpr uint8_t kLastStandardScalarType = 15;  // Byte .. BFloat16

// MethodMeta::input_tensor_meta / output_tensor_meta read, for each value an
// input or output names: the value table, its tensor, the tensor's sizes and
// dim order without null checks, and abort (ET_CHECK) on an unknown dtype or a
// byte count that overflows. "" when value `index` is safe to describe.
const char* check_io_value(const FlatView& v, uint64_t values, uint32_t n_values, int64_t index) {
  if (index < 0 || index >= n_values) return nullptr;  // ExecuTorch checks this one
  uint64_t value, type_at, tensor, sizes, dim_order;
  uint32_t n_sizes, n_dims;
  if (!v.deref(values + 4 + 4ull * static_cast<uint64_t>(index), &value) ||
      !v.field(value, kValueType, &type_at))
    return "an input or output value is out of bounds";
  if (type_at >= v.size()) return "an input or output value is out of bounds";
  if (type_at == 0 || v.byte(type_at) != kKernelTypesTensor) return "";
  if (!v.child(value, kValueVal, &tensor) || tensor == 0)
    return "an input or output tensor is missing";
  uint64_t scalar_at;
  if (!v.field(tensor, kTensorScalarType, &scalar_at) || !v.child(tensor, kTensorSizes, &sizes) ||
      !v.child(tensor, kTensorDimOrder, &dim_order) || sizes == 0 || dim_order == 0 ||
      !v.length(sizes, 4, &n_sizes) || !v.length(dim_order, 1, &n_dims))
    return "an input or output tensor has no sizes or dim order";
  if (scalar_at != 0 && (scalar_at >= v.size() || v.byte(scalar_at) > kLastStandardScalarType))
    return "an input or output tensor has an unknown dtype";
  uint64_t numel = 1;
  for (uint32_t d = 0; d < n_sizes; ++d) {
    uint32_t size;
    if (!v.u32(sizes + 4 + 4ull * d, &size) || static_cast<int32_t>(size) < 0 ||
        __builtin_mul_overflow(numel, static_cast<uint64_t>(size), &numel) ||
        numel > (UINT64_MAX >> 5))
      return "an input or output tensor has a negative or overflowing size";
  }
  return "";
}
constexpr unsigned kDelegateId = 0, kDelegateProcessed = 1, kDelegateCompileSpecs = 2;
constexpr unsigned kSpecKey = 0, kSpecValue = 1;

}  // namespace

std::string check_delegate_tables(const uint8_t* data, size_t size) {
  const FlatView v(data, size);
  char text[160];
  uint64_t root, plans;
  uint32_t n_plans;
  if (!v.deref(0, &root) || !v.child(root, kProgramExecutionPlan, &plans))
    return "the program's root table is out of bounds";
  if (plans == 0) return "the program has no execution plans";
  if (!v.length(plans, 4, &n_plans)) return "the execution-plan list is out of bounds";
  for (uint32_t p = 0; p < n_plans; ++p) {
    uint64_t plan, name, delegates;
    uint32_t n_delegates = 0, name_length;
    if (!v.deref(plans + 4 + 4ull * p, &plan) || !v.child(plan, kPlanName, &name) ||
        !v.child(plan, kPlanDelegates, &delegates) ||
        (delegates != 0 && !v.length(delegates, 4, &n_delegates))) {
      std::snprintf(text, sizeof(text), "execution plan %u is out of bounds", p);
      return text;
    }
    if (name == 0 || !v.length(name, 1, &name_length)) {  // Module::method_names aborts
      std::snprintf(text, sizeof(text), "execution plan %u has no method name (damaged file?)", p);
      return text;
    }
    // MethodMeta reads these without null checks.
    uint64_t values, lists[2];
    uint32_t n_values = 0, n_list[2];
    if (!v.child(plan, kPlanValues, &values) || !v.child(plan, kPlanInputs, &lists[0]) ||
        !v.child(plan, kPlanOutputs, &lists[1]) || values == 0 || lists[0] == 0 ||
        lists[1] == 0 || delegates == 0 || !v.length(values, 4, &n_values) ||
        !v.length(lists[0], 4, &n_list[0]) || !v.length(lists[1], 4, &n_list[1])) {
      std::snprintf(text, sizeof(text), "execution plan %u lacks its values, inputs, outputs or "
                    "delegate list (damaged file?)", p);
      return text;
    }
    for (int l = 0; l < 2; ++l) {
      for (uint32_t i = 0; i < n_list[l]; ++i) {
        uint32_t index;
        const char* problem = v.u32(lists[l] + 4 + 4ull * i, &index)
                                  ? check_io_value(v, values, n_values, static_cast<int32_t>(index))
                                  : "an input or output list is out of bounds";
        if (problem != nullptr && *problem != '\0') {
          std::snprintf(text, sizeof(text), "execution plan %u, %s %u: %s (damaged file?)", p,
                        l == 0 ? "input" : "output", i, problem);
          return text;
        }
      }
    }
    for (uint32_t d = 0; d < n_delegates; ++d) {
      uint64_t delegate, id, processed, specs;
      uint32_t n_specs = 0, id_length;
      const char* missing = nullptr;
      if (!v.deref(delegates + 4 + 4ull * d, &delegate) || !v.child(delegate, kDelegateId, &id) ||
          !v.child(delegate, kDelegateProcessed, &processed) ||
          !v.child(delegate, kDelegateCompileSpecs, &specs))
        missing = "its table is out of bounds";
      else if (id == 0 || !v.length(id, 1, &id_length))
        missing = "it has no backend id";
      else if (processed == 0)
        missing = "it has no reference to its data";
      else if (specs == 0 || !v.length(specs, 4, &n_specs))
        missing = "it has no compile-spec list";
      for (uint32_t s = 0; missing == nullptr && s < n_specs; ++s) {
        uint64_t spec, key, value;
        uint32_t n;
        if (!v.deref(specs + 4 + 4ull * s, &spec) || !v.child(spec, kSpecKey, &key) ||
            !v.child(spec, kSpecValue, &value) || key == 0 || value == 0 ||
            !v.length(key, 1, &n) || !v.length(value, 1, &n))
          missing = "one of its compile specs has no key or no value";
      }
      if (missing != nullptr) {
        std::snprintf(text, sizeof(text), "execution plan %u, delegate %u: %s (damaged file?)", p,
                      d, missing);
        return text;
      }
    }
  }
  return "";
}

std::vector<uint8_t> read_program_flatbuffer(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return {};
  std::fseek(f, 0, SEEK_END);
  size_t want = static_cast<size_t>(std::max(0L, std::ftell(f)));
  std::fseek(f, 0, SEEK_SET);
  std::vector<uint8_t> head(24);
  if (std::fread(head.data(), 1, head.size(), f) == head.size() &&
      std::memcmp(head.data() + 8, "eh00", 4) == 0) {
    uint64_t program_size = 0;
    for (int i = 7; i >= 0; --i) program_size = (program_size << 8) | head[16 + i];
    want = static_cast<size_t>(std::min<uint64_t>(program_size, want));
  }
  std::vector<uint8_t> bytes(want);
  std::fseek(f, 0, SEEK_SET);
  bytes.resize(std::fread(bytes.data(), 1, want, f));
  std::fclose(f);
  return bytes;
}

std::string check_delegate_tables_in_file(const std::string& path) {
  const std::vector<uint8_t> bytes = read_program_flatbuffer(path);
  if (bytes.empty()) return "";
  return check_delegate_tables(bytes.data(), bytes.size());
}

std::string read_io_devices(const uint8_t* data, size_t size, const std::string& method,
                            std::vector<IoDevice>* inputs, std::vector<IoDevice>* outputs) {
  const FlatView v(data, size);
  uint64_t root, plans;
  uint32_t n_plans;
  if (!v.deref(0, &root) || !v.child(root, kProgramExecutionPlan, &plans) || plans == 0 ||
      !v.length(plans, 4, &n_plans))
    return "the program's execution-plan list is out of bounds";
  for (uint32_t p = 0; p < n_plans; ++p) {
    uint64_t plan, name, values, lists[2];
    uint32_t name_length, n_values, n_list[2];
    if (!v.deref(plans + 4 + 4ull * p, &plan) || !v.child(plan, kPlanName, &name) || name == 0 ||
        !v.length(name, 1, &name_length))
      return "an execution plan is out of bounds";
    if (method.size() != name_length || std::memcmp(data + name + 4, method.data(), name_length) != 0)
      continue;
    if (!v.child(plan, kPlanValues, &values) || !v.child(plan, kPlanInputs, &lists[0]) ||
        !v.child(plan, kPlanOutputs, &lists[1]) || values == 0 || lists[0] == 0 || lists[1] == 0 ||
        !v.length(values, 4, &n_values) || !v.length(lists[0], 4, &n_list[0]) ||
        !v.length(lists[1], 4, &n_list[1]))
      return "method '" + method + "' lacks its values, inputs or outputs";
    std::vector<IoDevice>* out[2] = {inputs, outputs};
    for (int l = 0; l < 2; ++l) {
      out[l]->assign(n_list[l], IoDevice{});
      for (uint32_t i = 0; i < n_list[l]; ++i) {
        uint32_t index;
        uint64_t value, type_at, tensor, extra, device_at, index_at;
        if (!v.u32(lists[l] + 4 + 4ull * i, &index) || index >= n_values ||
            !v.deref(values + 4 + 4ull * index, &value) || !v.field(value, kValueType, &type_at) ||
            type_at >= v.size())
          return "an input or output of method '" + method + "' is out of bounds";
        if (type_at == 0 || v.byte(type_at) != kKernelTypesTensor) continue;  // not a tensor
        if (!v.child(value, kValueVal, &tensor) || tensor == 0 ||
            !v.child(tensor, kTensorExtraInfo, &extra))
          return "an input or output tensor of method '" + method + "' is out of bounds";
        if (extra == 0) continue;  // no extra info: on the CPU
        if (!v.field(extra, kExtraDeviceType, &device_at) ||
            !v.field(extra, kExtraDeviceIndex, &index_at) || device_at >= v.size() ||
            index_at >= v.size())
          return "an input or output tensor of method '" + method + "' is out of bounds";
        (*out[l])[i].type = device_at == 0 ? 0 : v.byte(device_at);
        (*out[l])[i].index = index_at == 0 ? 0 : static_cast<int8_t>(v.byte(index_at));
      }
    }
    return "";
  }
  return "the program has no method '" + method + "'";
}

bool fits_planned_shape(const int64_t* given, size_t rank, const std::vector<int64_t>& planned) {
  if (rank != planned.size()) return false;
  for (size_t d = 0; d < rank; ++d)
    if (given[d] < 0 || given[d] > planned[d]) return false;
  return true;
}

}  // namespace kiln::tools
