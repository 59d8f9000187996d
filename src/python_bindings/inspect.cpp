#include "inspect.h"

#include <cstdio>
#include <string>
#include <vector>

#include "engine_format/engine_format.h"

namespace kiln::python {

namespace {

using namespace kiln::engine;

const char* storage_name(StorageKind kind) {
  switch (kind) {
    case StorageKind::kInput: return "input";
    case StorageKind::kOutput: return "output";
    case StorageKind::kArena: return "arena";
    case StorageKind::kWeight: return "weight";
  }
  return "unknown";
}

const char* epilogue_name(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::kNone: return "none";
    case GemmEpilogue::kBias: return "bias";
    case GemmEpilogue::kReluBias: return "relu_bias";
    case GemmEpilogue::kRelu: return "relu";
  }
  return "unknown";
}

const char* activation_name(ConvActivation activation) {
  switch (activation) {
    case ConvActivation::kNone: return "none";
    case ConvActivation::kRelu: return "relu";
  }
  return "unknown";
}

template <typename T>
nb::list to_list(const T* values, size_t count) {
  nb::list list;
  for (size_t i = 0; i < count; ++i) list.append(values[i]);
  return list;
}

template <typename V>
nb::list to_list(const V& values) {
  return to_list(values.data(), values.size());
}

// kNoTensor -> None, so Python code does not have to know the sentinel.
nb::object tensor_index(uint32_t index) {
  if (index == kNoTensor) return nb::none();
  return nb::int_(index);
}

nb::dict tensor_dict(const TensorDesc& t) {
  nb::dict d;
  d["name"] = t.name;
  d["dtype"] = dtype_name(t.dtype);
  d["shape"] = to_list(t.shape);
  d["storage"] = storage_name(t.storage);
  d["io_index"] = t.io_index;
  d["offset"] = t.offset;
  d["nbytes"] = t.nbytes;
  return d;
}

// "8x56x56x64 -> 8x56x56x128, 3x3 s1x1 p1x1 d1x1 g1 +bias +z relu": one line
// for `kiln inspect`, so the Python side needs no conv-specific formatting.
std::string conv_summary(const ConvStep& c) {
  char text[256];
  std::snprintf(text, sizeof(text),
                "%lldx%lldx%lldx%lld -> %lldx%lldx%lldx%lld (NHWC), %lldx%lld s%lldx%lld "
                "p%lldx%lld d%lldx%lld g%lld%s%s %s",
                static_cast<long long>(c.n), static_cast<long long>(c.h),
                static_cast<long long>(c.w_in), static_cast<long long>(c.c),
                static_cast<long long>(c.n), static_cast<long long>(c.p),
                static_cast<long long>(c.q), static_cast<long long>(c.k),
                static_cast<long long>(c.r), static_cast<long long>(c.s),
                static_cast<long long>(c.stride_h), static_cast<long long>(c.stride_w),
                static_cast<long long>(c.pad_h), static_cast<long long>(c.pad_w),
                static_cast<long long>(c.dilation_h), static_cast<long long>(c.dilation_w),
                static_cast<long long>(c.groups), c.bias != kNoTensor ? " +bias" : "",
                c.z != kNoTensor ? " +z" : "", activation_name(c.activation));
  return text;
}

std::string gemm_summary(const GemmStep& g) {
  char text[256];
  int n = std::snprintf(text, sizeof(text), "m=%lld n=%lld k=%lld epilogue=%s",
                        static_cast<long long>(g.m), static_cast<long long>(g.n),
                        static_cast<long long>(g.k), epilogue_name(g.epilogue));
  if (g.batch > 1 && n > 0 && static_cast<size_t>(n) < sizeof(text))
    std::snprintf(text + n, sizeof(text) - n,
                  " batch=%lld strides a=%lld b=%lld%s out=%lld", static_cast<long long>(g.batch),
                  static_cast<long long>(g.stride_a), static_cast<long long>(g.stride_b),
                  g.c != kNoTensor ? (" c=" + std::to_string(g.stride_c)).c_str() : "",
                  static_cast<long long>(g.stride_out));
  return text;
}

nb::dict step_dict(const Step& s) {
  nb::dict d;
  d["label"] = s.label;
  if (s.kind == StepKind::kConv) {
    const ConvStep& c = s.conv;
    d["kind"] = "conv";
    d["summary"] = conv_summary(c);
    d["input_shape"] = to_list(std::vector<int64_t>{c.n, c.h, c.w_in, c.c});
    d["output_shape"] = to_list(std::vector<int64_t>{c.n, c.p, c.q, c.k});
    d["filter"] = to_list(std::vector<int64_t>{c.r, c.s});
    d["stride"] = to_list(std::vector<int64_t>{c.stride_h, c.stride_w});
    d["padding"] = to_list(std::vector<int64_t>{c.pad_h, c.pad_w});
    d["dilation"] = to_list(std::vector<int64_t>{c.dilation_h, c.dilation_w});
    d["groups"] = c.groups;
    d["activation"] = activation_name(c.activation);
    d["x"] = tensor_index(c.x);
    d["w"] = tensor_index(c.w);
    d["bias"] = tensor_index(c.bias);
    d["z"] = tensor_index(c.z);
    d["out"] = tensor_index(c.out);
  } else if (s.kind == StepKind::kGemm) {
    const GemmStep& g = s.gemm;
    d["kind"] = "gemm";
    d["m"] = g.m;
    d["n"] = g.n;
    d["k"] = g.k;
    d["epilogue"] = epilogue_name(g.epilogue);
    d["b_transposed"] = g.b_transposed;
    d["alpha"] = g.alpha;
    d["beta"] = g.beta;
    d["a"] = tensor_index(g.a);
    d["b"] = tensor_index(g.b);
    d["bias"] = tensor_index(g.bias);
    d["c"] = tensor_index(g.c);
    d["out"] = tensor_index(g.out);
    d["batch"] = g.batch;
    d["strides"] = to_list(std::vector<int64_t>{g.stride_a, g.stride_b, g.stride_c, g.stride_out});
    d["summary"] = gemm_summary(g);
  } else {
    const KernelStep& k = s.kernel;
    d["kind"] = "kernel";
    d["module"] = k.module;
    d["function"] = k.function;
    d["grid"] = to_list(k.grid, 3);
    d["block"] = to_list(k.block, 3);
    d["shared_bytes"] = k.shared_bytes;
    nb::list args;
    for (const KernelArg& arg : k.args) {
      nb::dict a;
      switch (arg.kind) {
        case KernelArgKind::kTensor:
          a["kind"] = "tensor";
          a["tensor"] = tensor_index(arg.tensor);
          break;
        case KernelArgKind::kInt64:
          a["kind"] = "int64";
          a["value"] = arg.i64;
          break;
        case KernelArgKind::kFloat32:
          a["kind"] = "float32";
          a["value"] = arg.f32;
          break;
      }
      args.append(a);
    }
    d["args"] = args;
  }
  return d;
}

nb::dict module_dict(const KernelModule& m) {
  nb::dict d;
  nb::list sms, cubin_bytes;
  for (const CubinImage& cubin : m.cubins) {
    sms.append(cubin.sm);
    cubin_bytes.append(cubin.image.size());
  }
  d["name"] = m.name;
  d["sms"] = sms;
  d["cubin_bytes"] = cubin_bytes;
  d["ptx_sm"] = m.ptx_sm;
  d["ptx_bytes"] = m.ptx.size();
  d["source"] = m.source;
  return d;
}

}  // namespace

nb::dict inspect_engine(nb::bytes data) {
  Result<EngineDesc> parsed = [&] {
    nb::gil_scoped_release release;
    return parse_engine(data.c_str(), data.size());
  }();
  if (!parsed.is_ok())
    throw nb::value_error(("not a valid Kiln engine: " + parsed.status().to_string()).c_str());
  const EngineDesc& desc = parsed.value();

  nb::dict out;
  nb::list tensors, steps, modules;
  for (const TensorDesc& t : desc.tensors) tensors.append(tensor_dict(t));
  for (const Step& s : desc.steps) steps.append(step_dict(s));
  for (const KernelModule& m : desc.modules) modules.append(module_dict(m));
  out["tensors"] = tensors;
  out["inputs"] = to_list(desc.inputs);
  out["outputs"] = to_list(desc.outputs);
  out["steps"] = steps;
  out["modules"] = modules;
  out["arena_bytes"] = desc.arena_bytes;
  out["weights_bytes"] = desc.weights.size();
  nb::dict metadata;
  for (const auto& [key, value] : desc.metadata) metadata[key.c_str()] = value;
  out["metadata"] = metadata;
  return out;
}

}  // namespace kiln::python
