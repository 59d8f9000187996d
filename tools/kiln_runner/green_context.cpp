#include "green_context.h"

#include <cstdio>

// Types and function-pointer typedefs only: nothing here links libcuda.
#include <cuda.h>
#include <cudaTypedefs.h>

namespace kiln::tools {
namespace {

// Driver versions the entry points are asked for: the green context API
// appeared in CUDA 12.4, cuGreenCtxStreamCreate in 12.5.
constexpr unsigned kGreenContextVersion = 12040;
constexpr unsigned kGreenStreamVersion = 12050;
constexpr int kMinDriverVersion = 12050;

struct DriverApi {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetDevResource_v12040 device_get_dev_resource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 sm_resource_split_by_count = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 dev_resource_generate_desc = nullptr;
  PFN_cuGreenCtxCreate_v12040 green_ctx_create = nullptr;
  PFN_cuGreenCtxDestroy_v12040 green_ctx_destroy = nullptr;
  PFN_cuGreenCtxGetDevResource_v12040 green_ctx_get_dev_resource = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 green_ctx_stream_create = nullptr;
  PFN_cuStreamSynchronize_v2000 stream_synchronize = nullptr;
  PFN_cuStreamDestroy_v4000 stream_destroy = nullptr;
};

std::string version_text(int version) {
  char text[32];
  std::snprintf(text, sizeof(text), "%d.%d", version / 1000, (version % 1000) / 10);
  return text;
}

std::string runtime_error(const char* call, cudaError_t error) {
  return std::string(call) + " failed: " + cudaGetErrorName(error) + " (" +
         cudaGetErrorString(error) + ")";
}

template <typename Fn>
std::string load(const char* symbol, unsigned version, Fn* fn) {
  void* pointer = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error =
      cudaGetDriverEntryPointByVersion(symbol, &pointer, version, cudaEnableDefault, &found);
  if (error != cudaSuccess)
    return runtime_error("cudaGetDriverEntryPointByVersion", error) + " for " + symbol;
  if (found == cudaDriverEntryPointVersionNotSufficent)
    return std::string("the CUDA driver has ") + symbol + " but not in the version " +
           version_text(static_cast<int>(version)) + " this runner uses";
  if (found != cudaDriverEntryPointSuccess || pointer == nullptr)
    return std::string("the CUDA driver does not provide ") + symbol +
           " (green contexts need a CUDA " + version_text(kMinDriverVersion) +
           " or newer driver)";
  *fn = reinterpret_cast<Fn>(pointer);
  return "";
}

// Loads every entry point once; returns the same answer on later calls.
const std::string& load_driver_api(DriverApi* api) {
  static DriverApi loaded;
  static const std::string problem = [] {
    std::string p;
    auto step = [&p](std::string result) {
      if (p.empty()) p = std::move(result);
    };
    step(load("cuGetErrorName", 6000, &loaded.get_error_name));
    step(load("cuGetErrorString", 6000, &loaded.get_error_string));
    step(load("cuDeviceGet", 2000, &loaded.device_get));
    step(load("cuDeviceGetDevResource", kGreenContextVersion, &loaded.device_get_dev_resource));
    step(load("cuDevSmResourceSplitByCount", kGreenContextVersion,
              &loaded.sm_resource_split_by_count));
    step(load("cuDevResourceGenerateDesc", kGreenContextVersion,
              &loaded.dev_resource_generate_desc));
    step(load("cuGreenCtxCreate", kGreenContextVersion, &loaded.green_ctx_create));
    step(load("cuGreenCtxDestroy", kGreenContextVersion, &loaded.green_ctx_destroy));
    step(load("cuGreenCtxGetDevResource", kGreenContextVersion,
              &loaded.green_ctx_get_dev_resource));
    step(load("cuGreenCtxStreamCreate", kGreenStreamVersion, &loaded.green_ctx_stream_create));
    step(load("cuStreamSynchronize", 2000, &loaded.stream_synchronize));
    step(load("cuStreamDestroy", 4000, &loaded.stream_destroy));
    return p;
  }();
  *api = loaded;
  return problem;
}

std::string driver_error(const DriverApi& api, const char* call, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.get_error_name == nullptr || api.get_error_name(result, &name) != CUDA_SUCCESS)
    name = nullptr;
  if (api.get_error_string == nullptr || api.get_error_string(result, &text) != CUDA_SUCCESS)
    text = nullptr;
  std::string message = std::string(call) + " failed: ";
  message += name != nullptr ? name : ("CUresult " + std::to_string(static_cast<int>(result)));
  if (text != nullptr) message += std::string(" (") + text + ")";
  return message;
}

// The device's whole SM resource, with the API loaded; "" or why not.
std::string device_sm_resource(DeviceSmInfo* info, DriverApi* api, CUdevice* device,
                               CUdevResource* resource) {
  int driver = 0;
  if (cudaError_t e = cudaDriverGetVersion(&driver); e != cudaSuccess)
    return runtime_error("cudaDriverGetVersion", e);
  if (driver == 0)
    return "no CUDA driver is installed on this machine (libcuda could not be loaded)";
  info->driver_version = driver;
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess)
    return "no usable CUDA device (driver " + version_text(driver) +
           "): " + runtime_error("cudaGetDeviceCount", e);
  if (count == 0) return "no CUDA device is visible on this machine";
  if (driver < kMinDriverVersion)
    return "the CUDA driver is version " + version_text(driver) + "; green context streams need " +
           version_text(kMinDriverVersion) + " or newer";
  if (cudaError_t e = cudaGetDevice(&info->ordinal); e != cudaSuccess)
    return runtime_error("cudaGetDevice", e);
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, info->ordinal); e != cudaSuccess)
    return runtime_error("cudaGetDeviceProperties", e);
  info->name = prop.name;
  // Make the primary context active first: cuGreenCtxCreate retains it, and
  // initializing it there for every green context would be slow.
  if (cudaError_t e = cudaFree(nullptr); e != cudaSuccess)
    return runtime_error("initializing the CUDA primary context (cudaFree(nullptr))", e);
  if (const std::string& problem = load_driver_api(api); !problem.empty()) return problem;
  if (CUresult r = api->device_get(device, info->ordinal); r != CUDA_SUCCESS)
    return driver_error(*api, "cuDeviceGet", r);
  if (CUresult r = api->device_get_dev_resource(*device, resource, CU_DEV_RESOURCE_TYPE_SM);
      r != CUDA_SUCCESS)
    return driver_error(*api, "cuDeviceGetDevResource(CU_DEV_RESOURCE_TYPE_SM)", r);
  info->sm_count = resource->sm.smCount;
  info->min_partition = resource->sm.minSmPartitionSize;
  info->alignment = resource->sm.smCoscheduledAlignment;
  return "";
}

}  // namespace

std::string query_device_sms(DeviceSmInfo* info) {
  DriverApi api;
  CUdevice device = 0;
  CUdevResource resource{};
  return device_sm_resource(info, &api, &device, &resource);
}

std::string GreenContext::create(unsigned requested_sms, std::unique_ptr<GreenContext>* out) {
  DeviceSmInfo info;
  DriverApi api;
  CUdevice device = 0;
  CUdevResource whole{};
  if (std::string problem = device_sm_resource(&info, &api, &device, &whole); !problem.empty())
    return problem;
  const std::string on_device = "device " + std::to_string(info.ordinal) + " (" + info.name +
                                ") has " + std::to_string(info.sm_count) + " SMs";
  if (requested_sms > info.sm_count)
    return std::to_string(requested_sms) + " SMs requested, but " + on_device;
  if (requested_sms < info.min_partition)
    return std::to_string(requested_sms) + " SMs requested, below the smallest green context " +
           "the driver allows (" + std::to_string(info.min_partition) + " SMs); " + on_device;

  // Round to the alignment ourselves (up, or down when up would not fit), so
  // the driver is asked for a group it can make.
  const unsigned align = info.alignment > 0 ? info.alignment : 1;
  unsigned count = (requested_sms + align - 1) / align * align;
  if (count > info.sm_count) count = requested_sms / align * align;
  if (count < info.min_partition) count = info.min_partition;

  CUdevResource group{};
  CUdevResource remaining{};
  unsigned groups = 1;
  if (CUresult r = api.sm_resource_split_by_count(&group, &groups, &whole, &remaining, 0, count);
      r != CUDA_SUCCESS)
    return driver_error(api, "cuDevSmResourceSplitByCount", r) + " for " +
           std::to_string(count) + " SMs (" + std::to_string(requested_sms) + " requested; " +
           on_device + ", minimum " + std::to_string(info.min_partition) + ", alignment " +
           std::to_string(info.alignment) + ")";
  if (groups < 1)
    return "cuDevSmResourceSplitByCount made no group of " + std::to_string(count) + " SMs (" +
           std::to_string(requested_sms) + " requested; " + on_device + ", minimum " +
           std::to_string(info.min_partition) + ", alignment " +
           std::to_string(info.alignment) + ")";

  CUdevResourceDesc desc = nullptr;
  if (CUresult r = api.dev_resource_generate_desc(&desc, &group, 1); r != CUDA_SUCCESS)
    return driver_error(api, "cuDevResourceGenerateDesc", r);

  std::unique_ptr<GreenContext> context(new GreenContext());
  context->requested_sms_ = requested_sms;
  context->device_ = info;
  context->obtained_sms_ = group.sm.smCount;
  CUgreenCtx green = nullptr;
  if (CUresult r = api.green_ctx_create(&green, desc, device, CU_GREEN_CTX_DEFAULT_STREAM);
      r != CUDA_SUCCESS)
    return driver_error(api, "cuGreenCtxCreate", r) + " for " +
           std::to_string(group.sm.smCount) + " SMs";
  context->green_ctx_ = green;  // from here on, the destructor cleans up
  CUstream stream = nullptr;
  if (CUresult r = api.green_ctx_stream_create(&stream, green, CU_STREAM_NON_BLOCKING, 0);
      r != CUDA_SUCCESS)
    return driver_error(api, "cuGreenCtxStreamCreate", r);
  context->stream_ = stream;
  CUdevResource held{};
  if (CUresult r = api.green_ctx_get_dev_resource(green, &held, CU_DEV_RESOURCE_TYPE_SM);
      r != CUDA_SUCCESS)
    return driver_error(api, "cuGreenCtxGetDevResource", r);
  context->obtained_sms_ = held.sm.smCount;
  *out = std::move(context);
  return "";
}

std::string GreenContext::destroy() {
  DriverApi api;
  load_driver_api(&api);  // loaded already, or nothing was created
  std::string problem;
  if (stream_ != nullptr) {
    if (CUresult r = api.stream_synchronize(stream_); r != CUDA_SUCCESS)
      problem = driver_error(api, "cuStreamSynchronize", r);
    if (CUresult r = api.stream_destroy(stream_); r != CUDA_SUCCESS && problem.empty())
      problem = driver_error(api, "cuStreamDestroy", r);
    stream_ = nullptr;
  }
  if (green_ctx_ != nullptr) {
    if (CUresult r = api.green_ctx_destroy(static_cast<CUgreenCtx>(green_ctx_));
        r != CUDA_SUCCESS && problem.empty())
      problem = driver_error(api, "cuGreenCtxDestroy", r);
    green_ctx_ = nullptr;
  }
  return problem;
}

GreenContext::~GreenContext() { destroy(); }

}  // namespace kiln::tools
