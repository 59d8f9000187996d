// kiln._kiln_compiler: the compiler as the Python package sees it.
//
//   Graph               builds one partition's ir::Graph
//   check_support       the partitioner's question: does Kiln take this node?
//   supported_ops       the ATen op names the compiler knows
//   first_output_only   {op: reason} for multi-output ops computing output 0 only
//   compile             Graph -> serialized engine bytes (GIL released)
//   inspect_engine      engine bytes -> dict, for tests and tooling
//   CompileError        raised for kiln::CompileError (a RuntimeError)
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codegen/nvrtc_compiler.h"
#include "compiler/compiler.h"
#include "engine_format/engine_format.h"
#include "engine_format/variant_set.h"
#include "convert.h"
#include "inspect.h"
#include "variant_set.h"
#include "ir/graph.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kiln::python {
namespace {

std::vector<uint8_t> bytes_to_vector(nb::bytes data) {
  const auto* begin = reinterpret_cast<const uint8_t*>(data.c_str());
  return std::vector<uint8_t>(begin, begin + data.size());
}

compiler::TensorInfo tensor_info(nb::handle item, bool with_constant_flag, const char* what) {
  if (!nb::isinstance<nb::tuple>(item) && !nb::isinstance<nb::list>(item))
    throw nb::type_error((std::string(what) + ": expected a (dtype, shape" +
                          (with_constant_flag ? ", is_constant)" : ")") + " tuple")
                             .c_str());
  nb::sequence seq = nb::borrow<nb::sequence>(item);
  size_t expected = with_constant_flag ? 3 : 2;
  if (nb::len(seq) != expected)
    throw nb::value_error((std::string(what) + ": expected " + std::to_string(expected) +
                           " fields, got " + std::to_string(nb::len(seq)))
                              .c_str());
  compiler::TensorInfo info;
  info.dtype = dtype_from_string(nb::cast<std::string>(seq[0]), what);
  info.shape = shape_from_python(seq[1], what);
  if (with_constant_flag) info.is_constant = nb::cast<bool>(seq[2]);
  return info;
}

std::vector<compiler::TensorInfo> tensor_infos(nb::handle list, bool with_constant_flag,
                                               const char* what) {
  std::vector<compiler::TensorInfo> infos;
  size_t i = 0;
  for (nb::handle item : list) {
    std::string label = std::string(what) + "[" + std::to_string(i++) + "]";
    infos.push_back(tensor_info(item, with_constant_flag, label.c_str()));
  }
  return infos;
}

std::optional<std::string> py_check_support(std::string op, nb::list inputs, nb::dict attrs,
                                            nb::list outputs) {
  compiler::OpQuery query;
  query.op = std::move(op);
  query.inputs = tensor_infos(inputs, true, "inputs");
  query.attrs = attrs_from_python(attrs);
  query.outputs = tensor_infos(outputs, false, "outputs");
  return compiler::check_support(query);
}

// Thrown from the progress hook to unwind the compiler when the Python
// callback raised; the saved Python error is restored once the GIL is back.
struct ProgressCallbackFailed {};

nb::object py_compile(const ir::Graph& graph, std::vector<uint32_t> target_sms, bool emit_ptx,
                      std::vector<std::string> enabled_precisions, int use_cuda_graphs,
                      nb::object progress, const std::string& conv_gemm, bool depthwise_kernels,
                      const std::string& debug_dir, bool gemv_kernels, std::vector<uint32_t> cubin_sms,
                      bool overlap_launches, const std::string& name_weights, bool return_weights,
                      bool persistent_decode, const std::map<std::string, int64_t>& persistent_decode_options) {
  if (return_weights && name_weights.empty())
    throw nb::value_error("compile: return_weights needs name_weights (a key prefix)");
  if (use_cuda_graphs < -1 || use_cuda_graphs > 1)
    throw nb::value_error("use_cuda_graphs must be -1 (no choice), 0 or 1");
  compiler::CompileOptions options;
  options.target_sms = std::move(target_sms);
  options.cubin_sms = std::move(cubin_sms);
  options.emit_ptx = emit_ptx;
  options.enabled_precisions.clear();
  for (const std::string& name : enabled_precisions)
    options.enabled_precisions.push_back(dtype_from_string(name, "enabled_precisions"));
  options.use_cuda_graphs = use_cuda_graphs;
  options.op_options.conv_gemm = ops::parse_conv_gemm(conv_gemm);
  options.op_options.depthwise_kernels = depthwise_kernels;
  options.op_options.gemv_kernels = gemv_kernels;
  options.op_options.persistent_decode = persistent_decode;
  if (!persistent_decode_options.empty() && !persistent_decode)
    throw nb::value_error("compile: persistent_decode_options need persistent_decode=True");
  for (const auto& [name, value] : persistent_decode_options) {
    const std::string why = ops::set_decode_layers_option(options.op_options.decode_layers, name, value);
    if (!why.empty()) throw nb::value_error(("persistent_decode: " + why).c_str());
  }
  const std::string invalid = ops::decode_layers_options_invalid(options.op_options.decode_layers);
  if (!invalid.empty()) throw nb::value_error(("persistent_decode: " + invalid).c_str());
  options.overlap_launches = overlap_launches;
  options.debug_dir = debug_dir;
  options.weights_named_as = name_weights;

  std::optional<nb::python_error> callback_error;
  if (!progress.is_none()) {
    if (!PyCallable_Check(progress.ptr())) throw nb::type_error("progress must be callable or None");
    options.progress = [&progress, &callback_error](const std::string& message) {
      nb::gil_scoped_acquire acquire;
      if (callback_error) return;
      try {
        progress(message);
      } catch (nb::python_error& e) {
        callback_error.emplace(std::move(e));
        throw ProgressCallbackFailed{};
      }
    };
  }

  std::vector<uint8_t> engine;
  std::vector<engine::ExternalWeight> weights;
  try {
    nb::gil_scoped_release release;
    engine = compiler::compile_graph(graph, options, return_weights ? &weights : nullptr);
  } catch (...) {
    // The compiler may have wrapped our unwind; the callback's error wins.
    if (callback_error) {
      callback_error->restore();
      throw nb::python_error();
    }
    throw;
  }
  if (callback_error) {
    callback_error->restore();
    throw nb::python_error();
  }
  nb::bytes blob(engine.data(), engine.size());
  if (!return_weights) return blob;
  return nb::make_tuple(blob, external_weights_to_python(weights));
}

nb::list py_add_node(ir::Graph& graph, const std::string& op, const std::string& name,
                     std::vector<int> inputs, nb::handle attrs, nb::list outputs) {
  std::vector<std::pair<engine::DType, std::vector<int64_t>>> output_types;
  size_t i = 0;
  for (nb::handle item : outputs) {
    std::string label = "node '" + name + "' outputs[" + std::to_string(i++) + "]";
    compiler::TensorInfo info = tensor_info(item, false, label.c_str());
    output_types.emplace_back(info.dtype, std::move(info.shape));
  }
  int index = graph.add_node(op, name, std::move(inputs), attrs_from_python(attrs), output_types);
  nb::list ids;
  for (int id : graph.nodes().at(static_cast<size_t>(index)).outputs) ids.append(id);
  return ids;
}

}  // namespace
}  // namespace kiln::python

NB_MODULE(_kiln_compiler, m) {
  using namespace kiln;
  using namespace kiln::python;
  m.doc() = "Kiln's engine compiler (export side): capability queries, compile, inspect.";

  // Registered first so every binding below translates kiln::CompileError.
  nb::exception<kiln::CompileError>(m, "CompileError", PyExc_RuntimeError);

  nb::class_<ir::Graph>(m, "Graph", "One partition as Kiln IR; values are referred to by id.")
      .def(nb::init<>())
      .def(
          "add_input",
          [](ir::Graph& g, const std::string& name, const std::string& dtype, nb::handle shape) {
            return g.add_input(name, dtype_from_string(dtype, name.c_str()),
                               shape_from_python(shape, name.c_str()));
          },
          "name"_a, "dtype"_a, "shape"_a, "Adds a graph input; returns its value id.")
      .def(
          "add_constant",
          [](ir::Graph& g, const std::string& name, const std::string& dtype, nb::handle shape,
             nb::bytes data) {
            return g.add_constant(name, dtype_from_string(dtype, name.c_str()),
                                  shape_from_python(shape, name.c_str()), bytes_to_vector(data));
          },
          "name"_a, "dtype"_a, "shape"_a, "data"_a,
          "Adds a constant with its contiguous row-major bytes; returns its value id.")
      .def(
          "add_state",
          [](ir::Graph& g, const std::string& name, const std::string& dtype, nb::handle shape,
             const std::string& key, nb::bytes init) {
            return g.add_state(name, dtype_from_string(dtype, name.c_str()), shape_from_python(shape, name.c_str()),
                               key, bytes_to_vector(init));
          },
          "name"_a, "dtype"_a, "shape"_a, "key"_a, "init"_a,
          "Adds a mutable state (a buffer the program updates in place) with its initial bytes "
          "(b'' for zeros); returns its value id.")
      .def("set_state_update", &ir::Graph::set_state_update, "state"_a, "value"_a,
           "After a run, state `state` holds `value` (written in place).")
      .def("add_node", &py_add_node, "op"_a, "name"_a, "inputs"_a, "attrs"_a, "outputs"_a,
           "Adds a node; `outputs` is a list of (dtype, shape). Returns the output value ids.")
      .def("set_outputs", &ir::Graph::set_outputs, "outputs"_a)
      .def_prop_ro("inputs", [](const ir::Graph& g) { return g.inputs(); })
      .def_prop_ro("outputs", [](const ir::Graph& g) { return g.outputs(); })
      .def_prop_ro("num_nodes", [](const ir::Graph& g) { return g.nodes().size(); })
      .def_prop_ro("num_values", [](const ir::Graph& g) { return g.values().size(); })
      .def("describe", &ir::Graph::describe)
      .def("verify", &ir::Graph::verify, "Raises CompileError naming the first structural problem.")
      .def("__repr__", [](const ir::Graph& g) {
        return "<kiln Graph: " + std::to_string(g.nodes().size()) + " nodes, " +
               std::to_string(g.values().size()) + " values>";
      });

  m.def("check_support", &py_check_support, "op"_a, "inputs"_a, "attrs"_a, "outputs"_a,
        "None when the compiler takes the node; otherwise the reason it does not.\n"
        "inputs: [(dtype, shape, is_constant)], outputs: [(dtype, shape)].");
  m.def("supported_ops", &compiler::supported_ops);
  m.def("constant_view_ops", &compiler::constant_view_ops,
        "Ops whose node is a compile-time constant whenever its input is (views, permutes).");
  m.def("first_output_only", &compiler::first_output_only_ops,
        "{op: reason} for multi-output ops of which the compiler computes output 0 only.");
  m.def("compile", &py_compile, "graph"_a, "target_sms"_a, "emit_ptx"_a = true,
        "enabled_precisions"_a = std::vector<std::string>{"float32"},
        "use_cuda_graphs"_a = -1, "progress"_a = nb::none(), "conv_gemm"_a = "all",
        "depthwise_kernels"_a = true, "debug_dir"_a = "", "gemv_kernels"_a = true,
        "cubin_sms"_a = std::vector<uint32_t>{}, "overlap_launches"_a = true, "name_weights"_a = "",
        "return_weights"_a = false, "persistent_decode"_a = false,
        "persistent_decode_options"_a = std::map<std::string, int64_t>{},
        "Compiles a Graph into serialized engine bytes. Raises CompileError.\n"
        "cubin_sms: the SMs that get a cubin (empty: each of target_sms).\n"
        "name_weights: a key prefix: the weights are named with it and left out of the engine.\n"
        "return_weights (with name_weights): returns (engine bytes, [(key, tensor name, weight bytes)]),\n"
        "the weights left out, as externalize_weights gives them.\n"
        "persistent_decode_options (with persistent_decode): the persistent kernel's tuning options by name.");
  m.def(
      "nvrtc_cache_stats",
      [] {
        const codegen::NvrtcCacheStats s = codegen::nvrtc_cache_stats();
        nb::dict d;
        d["compiles"] = s.compiles;
        d["assembles"] = s.assembles;
        d["hits"] = s.hits;
        d["disk_hits"] = s.disk_hits;
        d["disk_writes"] = s.disk_writes;
        d["entries"] = s.entries;
        d["bytes"] = s.bytes;
        d["seconds"] = s.seconds;
        return d;
      },
      "The kernel compiler's process totals: NVRTC compiles, nvJitLink assembles, cache hits (in\n"
      "process and on disk, KILN_KERNEL_CACHE), disk writes, and wall seconds spent compiling kernels.");
  m.def("persistent_decode_option_names", &ops::decode_layers_option_names,
        "The persistent decode kernel's option names (kiln.compile's persistent_decode_options).");
  m.def("pass_names", &compiler::pass_names, "The compiler's passes, in the order they run.");
  m.def("inspect_engine", &inspect_engine, "data"_a,
        "Parses engine bytes into a dict; raises ValueError when they are not a valid engine.");
  m.def("externalize_weights", &externalize_engine_weights, "data"_a, "key_prefix"_a,
        "Moves an engine's inline weights to named weights keyed key_prefix + content hash.\n"
        "Returns (engine bytes, [(key, tensor name, weight bytes)]); raises ValueError.");
  m.def("hash_bytes", [](nb::bytes data) { return engine::hash_bytes(data.c_str(), data.size()); },
        "data"_a, "The 64-bit content hash named weights are keyed and checked by.");
  m.def("pack_variant_set", &pack_variant_set, "symbols"_a, "bindings"_a, "values"_a, "engines"_a,
        "One delegate blob from one engine per shape variant of a dynamic partition:\n"
        "symbols [(name, min, max)], bindings [(input, dim, symbol)], values [[int per symbol]\n"
        "per variant], engines [bytes]. Raises ValueError for an inconsistent description.");
  m.def("unpack_variant_set", &unpack_variant_set, "data"_a,
        "A variant set as {symbols, bindings, values, engines}; raises ValueError.");
  m.def("is_variant_set", &is_variant_set, "data"_a, "True for a variant set (else one engine).");
  m.attr("ENGINE_FORMAT_VERSION") = engine::kEngineFormatVersion;
  m.attr("MAX_SHAPE_VARIANTS") = engine::kMaxVariants;
}
