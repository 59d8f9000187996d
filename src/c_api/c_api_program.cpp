// Programs and method metadata: everything here works without a GPU.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <sys/stat.h>

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/platform/log.h>
#include <executorch/runtime/platform/runtime.h>

#include "c_api_internal.h"
#include "delegate/backend_options.h"
#include "gpu_probe.h"      // tools/kiln_runner (kiln_runner_support)
#include "program_check.h"  // tools/kiln_runner (kiln_runner_support)

namespace et = executorch::runtime;
using executorch::extension::Module;

namespace kiln::c_api {
namespace {

thread_local std::string t_last_error;

const char* device_words(int32_t type) { return type == KILN_DEVICE_CUDA ? "CUDA device" : "the CPU"; }

// Fills `slot` from the method's signature; false with *why when ExecuTorch
// cannot describe it.
bool describe_slot(const et::MethodMeta& meta, bool input, size_t i,
                   const kiln::tools::IoDevice& device, IoSlot* slot, std::string* why) {
  et::Result<et::Tag> tag = input ? meta.input_tag(i) : meta.output_tag(i);
  if (!tag.ok()) {
    *why = "cannot read its tag";
    return false;
  }
  slot->is_tensor = *tag == et::Tag::Tensor;
  slot->device_type = device.type == 1 ? KILN_DEVICE_CUDA : KILN_DEVICE_CPU;
  slot->device_index = device.index;
  if (!slot->is_tensor) return true;
  et::Result<et::TensorInfo> info = input ? meta.input_tensor_meta(i) : meta.output_tensor_meta(i);
  if (!info.ok()) {
    *why = "cannot read its tensor metadata";
    return false;
  }
  if (info->sizes().size() > KILN_MAX_DIMS) {
    *why = "has more than " + std::to_string(KILN_MAX_DIMS) + " dims";
    return false;
  }
  slot->dtype = static_cast<int32_t>(info->scalar_type());
  slot->memory_planned = info->is_memory_planned();
  slot->nbytes = info->nbytes();
  slot->sizes.assign(info->sizes().begin(), info->sizes().end());
  slot->shape.assign(info->sizes().begin(), info->sizes().end());
  slot->out_shape.assign(KILN_MAX_DIMS, 0);
  slot->dim_order.resize(slot->sizes.size());
  slot->strides.resize(slot->sizes.size());
  executorch::aten::StridesType stride = 1;
  for (size_t d = slot->sizes.size(); d-- > 0;) {
    slot->dim_order[d] = static_cast<executorch::aten::DimOrderType>(d);
    slot->strides[d] = stride;
    stride *= slot->sizes[d];
  }
  if (input) {
    slot->impl = std::make_unique<executorch::aten::TensorImpl>(
        info->scalar_type(), static_cast<ssize_t>(slot->sizes.size()), slot->sizes.data(), nullptr,
        slot->dim_order.data(), slot->strides.data(), executorch::aten::TensorShapeDynamism::STATIC,
        slot->device_type == KILN_DEVICE_CUDA ? executorch::aten::DeviceType::CUDA
                                              : executorch::aten::DeviceType::CPU,
        static_cast<int8_t>(slot->device_index));
  }
  return true;
}

}  // namespace

kiln_status fail(kiln_status status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

kiln_status ok() {
  t_last_error.clear();
  return KILN_OK;
}

std::string describe(int32_t dtype, const int64_t* shape, int32_t ndim, int32_t device_type,
                     int32_t device_index) {
  std::string text = kiln_dtype_name(dtype);
  text += " [";
  for (int32_t d = 0; d < ndim; ++d) text += (d ? ", " : "") + std::to_string(shape[d]);
  text += "] on ";
  text += device_words(device_type);
  if (device_type == KILN_DEVICE_CUDA) text += " " + std::to_string(device_index);
  return text;
}

std::string MethodState::where(const char* what, size_t index) const {
  return "method '" + name + "': " + what + " " + std::to_string(index) + ": ";
}

}  // namespace kiln::c_api

using namespace kiln::c_api;  // NOLINT: the C entry points below

extern "C" {

const char* kiln_last_error(void) { return t_last_error.c_str(); }

const char* kiln_dtype_name(int32_t dtype) {
  switch (dtype) {
    case KILN_DTYPE_UINT8: return "uint8";
    case KILN_DTYPE_INT8: return "int8";
    case KILN_DTYPE_INT16: return "int16";
    case KILN_DTYPE_INT32: return "int32";
    case KILN_DTYPE_INT64: return "int64";
    case KILN_DTYPE_FLOAT16: return "float16";
    case KILN_DTYPE_FLOAT32: return "float32";
    case KILN_DTYPE_FLOAT64: return "float64";
    case KILN_DTYPE_BOOL: return "bool";
    case KILN_DTYPE_BFLOAT16: return "bfloat16";
    default: return "unknown";
  }
}

int kiln_gpu_available(const char** reason) {
  et::runtime_init();
  et::BackendInterface* kiln = et::get_backend_class(kKilnBackendName);
  if (kiln != nullptr && kiln->is_available()) {
    if (reason != nullptr) *reason = "";
    return 1;
  }
  // Computed once: the answer does not change within a process.
  static const std::string why = [kiln] {
    if (kiln == nullptr) return std::string("KilnBackend is not registered (libexecutorch_backend_kiln.so not loaded)");
    std::string cause = kiln::tools::describe_missing_gpu();
    return cause.empty() ? std::string("the CUDA runtime sees a GPU, yet KilnBackend reports none")
                         : cause;
  }();
  if (reason != nullptr) *reason = why.c_str();
  return 0;
}

kiln_status kiln_program_load(const char* path, const char* data_path, kiln_program** out) {
  if (path == nullptr || out == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_program_load: path and out must not be NULL");
  *out = nullptr;
  et::runtime_init();
  struct stat st;
  if (::stat(path, &st) != 0 || !S_ISREG(st.st_mode))
    return fail(KILN_ERROR_NOT_FOUND, std::string("cannot load program '") + path + "': no such file");
  if (data_path != nullptr && (::stat(data_path, &st) != 0 || !S_ISREG(st.st_mode)))
    return fail(KILN_ERROR_NOT_FOUND, std::string("cannot load program '") + path +
                                          "': no such data file '" + data_path + "'");
  if (std::string why = kiln::tools::check_delegate_tables_in_file(path); !why.empty())
    return fail(KILN_ERROR_LOAD, std::string("cannot load program '") + path + "': " + why +
                                     " (not a .pte, or a damaged one?)");
  auto state = std::make_shared<ProgramState>();
  state->path = path;
  state->module = data_path == nullptr
                      ? std::make_unique<Module>(path, Module::LoadMode::Mmap)
                      : std::make_unique<Module>(path, data_path, Module::LoadMode::Mmap);
  // Whole-program verification (program_check.h): a damaged file fails here.
  et::Error error = state->module->load(kiln::tools::kProgramVerification);
  if (error != et::Error::Ok) {
    char code[96];
    std::snprintf(code, sizeof(code), "ExecuTorch error %s (0x%x)", et::to_string(error),
                  static_cast<unsigned>(error));
    return fail(KILN_ERROR_LOAD, std::string("cannot load program '") + path + "': " + code +
                                     " (not a .pte, or a damaged one?)");
  }
  auto names = state->module->method_names();
  if (!names.ok()) return fail(KILN_ERROR_LOAD, std::string("cannot read the method names of '") + path + "'");
  state->method_names.assign(names->begin(), names->end());
  std::sort(state->method_names.begin(), state->method_names.end());
  state->flatbuffer = kiln::tools::read_program_flatbuffer(path);
  *out = new (std::nothrow) kiln_program{std::move(state)};
  if (*out == nullptr) return fail(KILN_ERROR_LOAD, "out of memory");
  return ok();
}

void kiln_program_destroy(kiln_program* program) { delete program; }

kiln_status kiln_program_num_methods(const kiln_program* program, size_t* out) {
  if (program == nullptr || out == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_program_num_methods: NULL argument");
  *out = program->state->method_names.size();
  return ok();
}

kiln_status kiln_program_method_name(const kiln_program* program, size_t index, const char** out) {
  if (program == nullptr || out == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_program_method_name: NULL argument");
  if (index >= program->state->method_names.size())
    return fail(KILN_ERROR_INVALID_ARGUMENT, "method index " + std::to_string(index) + " out of range (the program has " +
                                                 std::to_string(program->state->method_names.size()) + ")");
  *out = program->state->method_names[index].c_str();
  return ok();
}

kiln_status kiln_program_set_state_scope(kiln_program* program, const char* scope) {
  if (program == nullptr || scope == nullptr)
    return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_program_set_state_scope: NULL argument");
  ProgramState& ps = *program->state;
  std::string text;
  kiln::Status status = kiln::delegate::check_state_scope(scope, std::strlen(scope) + 1, &text);
  if (!status.is_ok())
    return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_program_set_state_scope: " + status.message());
  std::lock_guard<std::mutex> lock(ps.mutex);
  if (!ps.first_loaded.empty() && text != ps.state_scope)
    return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_program_set_state_scope: method '" + ps.first_loaded + "' of '" +
                                                 ps.path + "' is loaded in state scope '" + ps.state_scope +
                                                 "' already; set the scope before loading any method");
  ps.state_scope = std::move(text);
  return ok();
}

kiln_status kiln_method_open(kiln_program* program, const char* name, kiln_method** out) {
  if (program == nullptr || name == nullptr || out == nullptr)
    return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_open: NULL argument");
  *out = nullptr;
  ProgramState& ps = *program->state;
  std::lock_guard<std::mutex> lock(ps.mutex);
  if (!std::binary_search(ps.method_names.begin(), ps.method_names.end(), std::string(name))) {
    std::string list;
    for (const std::string& n : ps.method_names) list += (list.empty() ? "" : ", ") + n;
    return fail(KILN_ERROR_NOT_FOUND, "the program '" + ps.path + "' has no method '" + name + "' (it has: " + list + ")");
  }
  std::shared_ptr<MethodState> state = ps.methods[name].lock();
  if (state == nullptr) {
    state = std::make_shared<MethodState>();
    state->program = program->state;
    state->name = name;
    et::Result<et::MethodMeta> meta = ps.module->method_meta(name);
    if (!meta.ok()) return fail(KILN_ERROR_LOAD, "cannot read method '" + state->name + "' of '" + ps.path + "'");
    state->uses_kiln = meta->uses_backend(kKilnBackendName);
    std::vector<kiln::tools::IoDevice> in_devices, out_devices;
    if (std::string why = kiln::tools::read_io_devices(ps.flatbuffer.data(), ps.flatbuffer.size(), name,
                                                       &in_devices, &out_devices);
        !why.empty())
      return fail(KILN_ERROR_LOAD, "cannot read method '" + state->name + "': " + why);
    if (in_devices.size() != meta->num_inputs() || out_devices.size() != meta->num_outputs())
      return fail(KILN_ERROR_LOAD, "method '" + state->name + "': the signature's sizes disagree (damaged file?)");
    state->inputs.resize(meta->num_inputs());
    state->outputs.resize(meta->num_outputs());
    std::string why;
    for (size_t i = 0; i < state->inputs.size(); ++i)
      if (!describe_slot(*meta, true, i, in_devices[i], &state->inputs[i], &why))
        return fail(KILN_ERROR_LOAD, state->where("input", i) + why);
    for (size_t i = 0; i < state->outputs.size(); ++i)
      if (!describe_slot(*meta, false, i, out_devices[i], &state->outputs[i], &why))
        return fail(KILN_ERROR_LOAD, state->where("output", i) + why);
    for (const IoSlot& s : state->inputs) state->any_device_io |= s.device_type == KILN_DEVICE_CUDA;
    for (const IoSlot& s : state->outputs) state->any_device_io |= s.device_type == KILN_DEVICE_CUDA;
    ps.methods[name] = state;
  }
  *out = new (std::nothrow) kiln_method{std::move(state)};
  if (*out == nullptr) return fail(KILN_ERROR_LOAD, "out of memory");
  return ok();
}

void kiln_method_destroy(kiln_method* method) { delete method; }

kiln_status kiln_method_num_inputs(const kiln_method* method, size_t* out) {
  if (method == nullptr || out == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_num_inputs: NULL argument");
  *out = method->state->inputs.size();
  return ok();
}

kiln_status kiln_method_num_outputs(const kiln_method* method, size_t* out) {
  if (method == nullptr || out == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_num_outputs: NULL argument");
  *out = method->state->outputs.size();
  return ok();
}

static kiln_status slot_info(const kiln_method* method, bool input, size_t index, kiln_tensor_info* out) {
  if (method == nullptr || out == nullptr) return fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_method_*_info: NULL argument");
  const MethodState& ms = *method->state;
  const std::vector<IoSlot>& slots = input ? ms.inputs : ms.outputs;
  if (index >= slots.size())
    return fail(KILN_ERROR_INVALID_ARGUMENT, "method '" + ms.name + "' has " + std::to_string(slots.size()) +
                                                 (input ? " inputs" : " outputs") + ", no index " + std::to_string(index));
  const IoSlot& s = slots[index];
  out->is_tensor = s.is_tensor ? 1 : 0;
  out->dtype = s.dtype;
  out->device_type = s.device_type;
  out->device_index = s.device_index;
  out->ndim = static_cast<int32_t>(s.shape.size());
  out->shape = s.shape.data();
  out->nbytes = s.nbytes;
  return ok();
}

kiln_status kiln_method_input_info(const kiln_method* method, size_t index, kiln_tensor_info* out) {
  return slot_info(method, true, index, out);
}

kiln_status kiln_method_output_info(const kiln_method* method, size_t index, kiln_tensor_info* out) {
  return slot_info(method, false, index, out);
}

int kiln_method_uses_kiln(const kiln_method* method) {
  return method != nullptr && method->state->uses_kiln ? 1 : 0;
}

}  // extern "C"
