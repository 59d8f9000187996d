// The compiler pipeline: verify -> fold constants -> precision -> fuse ->
// plan memory -> generate and compile kernels -> lower to an EngineDesc ->
// serialize. Each phase reports progress through CompileOptions::progress.
#include "compiler/compiler.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "codegen/depthwise_codegen.h"
#include "codegen/nvrtc_compiler.h"
#include "codegen/pointwise_codegen.h"
#include "codegen/pool_codegen.h"
#include "codegen/reduce_codegen.h"
#include "engine_format/engine_format.h"
#include "passes/fuse_conv.h"
#include "passes/passes.h"

namespace kiln::compiler {
namespace {

class Lowering {
 public:
  Lowering(const ir::Graph& graph, const passes::ExecPlan& plan) : graph_(graph), plan_(plan) {}

  engine::EngineDesc run(const CompileOptions& options, engine::DType compute) {
    add_io_tensors();
    assign_storage();
    std::string source = codegen::pointwise_prelude();
    int kernels = 0;
    for (size_t i = 0; i < plan_.ops.size(); ++i) {
      const passes::PlannedOp& op = plan_.ops[i];
      engine::Step step;
      step.label = op.label;
      if (op.kind == passes::PlannedOp::Kind::kGemm) {
        step.kind = engine::StepKind::kGemm;
        const passes::GemmPlan& g = op.gemm;
        step.gemm.a = tensor(g.a);
        step.gemm.b = tensor(g.b);
        step.gemm.bias = g.bias >= 0 ? tensor(g.bias) : engine::kNoTensor;
        step.gemm.c = g.c >= 0 ? tensor(g.c) : engine::kNoTensor;
        step.gemm.out = tensor(g.out);
        step.gemm.m = g.m;
        step.gemm.n = g.n;
        step.gemm.k = g.k;
        step.gemm.b_transposed = g.b_transposed;
        step.gemm.epilogue = g.epilogue;
        step.gemm.alpha = g.alpha;
        step.gemm.beta = g.beta;
        step.gemm.batch = g.batch;
        step.gemm.stride_a = g.stride_a;
        step.gemm.stride_b = g.stride_b;
        step.gemm.stride_c = g.stride_c;
        step.gemm.stride_out = g.stride_out;
      } else if (op.kind == passes::PlannedOp::Kind::kConv) {
        step.kind = engine::StepKind::kConv;
        step.conv = lower_conv(op.conv);
      } else if (op.kind == passes::PlannedOp::Kind::kPool) {
        step.kind = engine::StepKind::kKernel;
        std::string function = "kiln_pool_" + std::to_string(kernels++);
        source += "\n" + codegen::generate_pool_kernel(graph_, op.pool, function);
        engine::KernelStep& k = step.kernel;
        k.function = function;
        int64_t n = graph_.value(op.pool.out).numel();
        k.grid[0] = static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(1, (n + codegen::kPoolBlock - 1) / codegen::kPoolBlock), 65536));
        k.block[0] = codegen::kPoolBlock;
        k.args = {tensor_arg(op.pool.out), tensor_arg(op.pool.input), int_arg(n)};
      } else if (op.kind == passes::PlannedOp::Kind::kDepthwise) {
        step.kind = engine::StepKind::kKernel;
        std::string function = "kiln_dw_" + std::to_string(kernels++);
        codegen::DepthwiseKernel gen = codegen::generate_depthwise_kernel(graph_, op.depthwise, function);
        source += "\n" + gen.source;
        engine::KernelStep& k = step.kernel;
        k.function = function;
        k.grid[0] = gen.grid;
        k.block[0] = gen.block;
        for (int v : gen.tensor_args) k.args.push_back(tensor_arg(v));
        k.args.push_back(int_arg(gen.n));
      } else if (op.kind == passes::PlannedOp::Kind::kReduce) {
        step.kind = engine::StepKind::kKernel;
        std::string function = "kiln_reduce_" + std::to_string(kernels++);
        codegen::ReduceKernel gen = codegen::generate_reduce_kernel(graph_, op.reduce, function);
        source += "\n" + gen.source;
        engine::KernelStep& k = step.kernel;
        k.function = function;
        for (int d = 0; d < 3; ++d) {
          k.grid[d] = gen.grid[d];
          k.block[d] = gen.block[d];
        }
        k.args = {tensor_arg(op.reduce.out), tensor_arg(op.reduce.input), int_arg(graph_.value(op.reduce.out).numel())};
      } else {
        step.kind = engine::StepKind::kKernel;
        std::string function = "kiln_pw_" + std::to_string(kernels++);
        source += "\n" + codegen::generate_pointwise_kernel(graph_, op.pointwise, function);
        engine::KernelStep& k = step.kernel;
        k.module = 0;
        k.function = function;
        int64_t n = op.pointwise.iter_shape.empty() ? graph_.value(op.pointwise.out).numel()
                                                    : ir::numel_of(op.pointwise.iter_shape);
        int64_t blocks = std::max<int64_t>(1, (n + codegen::kPointwiseBlock - 1) / codegen::kPointwiseBlock);
        k.grid[0] = static_cast<uint32_t>(std::min<int64_t>(blocks, 65536));
        k.block[0] = codegen::kPointwiseBlock;
        k.args.push_back(tensor_arg(op.pointwise.out));
        for (int in : op.pointwise.inputs) k.args.push_back(tensor_arg(in));
        engine::KernelArg count;
        count.kind = engine::KernelArgKind::kInt64;
        count.i64 = n;
        k.args.push_back(count);
      }
      desc_.steps.push_back(std::move(step));
    }
    if (kernels > 0) {
      if (options.progress) {
        std::ostringstream msg;
        msg << "generating " << kernels << " fused kernel" << (kernels == 1 ? "" : "s") << " with NVRTC for";
        for (uint32_t sm : options.target_sms) msg << " sm_" << sm;
        if (options.emit_ptx) msg << " + PTX";
        options.progress(msg.str());
      }
      desc_.modules.push_back(codegen::compile_module("kiln_kernels", source, options.target_sms, options.emit_ptx));
    }
    std::ostringstream sms;
    for (size_t i = 0; i < options.target_sms.size(); ++i) sms << (i ? "," : "") << options.target_sms[i];
    desc_.metadata.emplace_back("precision", engine::dtype_name(compute));
    desc_.metadata.emplace_back("target_sms", sms.str());
    desc_.metadata.emplace_back("nvrtc", codegen::nvrtc_version());
    desc_.metadata.emplace_back("source_nodes", std::to_string(graph_.nodes().size()));
    if (options.use_cuda_graphs >= 0)
      desc_.metadata.emplace_back("use_cuda_graphs", options.use_cuda_graphs ? "true" : "false");
    return std::move(desc_);
  }

 private:
  uint32_t tensor(int value) const {
    auto it = index_.find(plan_.storage_of(value));
    if (it == index_.end()) throw CompileError("internal: value '" + graph_.value(value).name + "' has no storage");
    return it->second;
  }
  static engine::KernelArg int_arg(int64_t v) {
    engine::KernelArg arg;
    arg.kind = engine::KernelArgKind::kInt64;
    arg.i64 = v;
    return arg;
  }

  engine::ConvStep lower_conv(const passes::ConvPlan& c) const {
    const ir::Value& x = graph_.value(c.x);
    const ir::Value& w = graph_.value(c.w);
    const ir::Value& y = graph_.value(c.out);
    engine::ConvStep s;
    s.x = tensor(c.x);
    s.w = tensor(c.w);
    s.bias = c.bias >= 0 ? tensor(c.bias) : engine::kNoTensor;
    s.z = c.z >= 0 ? tensor(c.z) : engine::kNoTensor;
    s.out = tensor(c.out);
    s.n = x.shape[0];
    s.h = x.shape[1];
    s.w_in = x.shape[2];
    s.c = x.shape[3];
    s.k = w.shape[0];
    s.r = w.shape[1];
    s.s = w.shape[2];
    s.p = y.shape[1];
    s.q = y.shape[2];
    s.pad_h = c.pad_h;
    s.pad_w = c.pad_w;
    s.stride_h = c.stride_h;
    s.stride_w = c.stride_w;
    s.dilation_h = c.dilation_h;
    s.dilation_w = c.dilation_w;
    s.groups = c.groups;
    s.activation = c.relu ? engine::ConvActivation::kRelu : engine::ConvActivation::kNone;
    for (int v : {c.x, c.w, c.bias, c.z})
      if (v >= 0 && graph_.value(v).dtype != y.dtype)
        throw CompileError("convolution '" + y.name + "': operand '" + graph_.value(v).name + "' is " +
                           engine::dtype_name(graph_.value(v).dtype) + ", result is " + engine::dtype_name(y.dtype));
    return s;
  }

  engine::KernelArg tensor_arg(int value) const {
    engine::KernelArg arg;
    arg.kind = engine::KernelArgKind::kTensor;
    arg.tensor = tensor(value);
    return arg;
  }

  uint32_t add_tensor(int value, engine::StorageKind storage, uint32_t io_index) {
    const ir::Value& v = graph_.value(value);
    engine::TensorDesc t;
    t.name = v.name;
    t.dtype = v.dtype;
    t.shape = v.shape;
    t.storage = storage;
    t.io_index = io_index;
    t.nbytes = v.nbytes();
    desc_.tensors.push_back(std::move(t));
    uint32_t index = static_cast<uint32_t>(desc_.tensors.size() - 1);
    index_[plan_.storage_of(value)] = index;
    return index;
  }

  void add_io_tensors() {
    for (size_t i = 0; i < graph_.inputs().size(); ++i)
      desc_.inputs.push_back(add_tensor(graph_.inputs()[i], engine::StorageKind::kInput, static_cast<uint32_t>(i)));
    for (size_t i = 0; i < graph_.outputs().size(); ++i)
      desc_.outputs.push_back(add_tensor(graph_.outputs()[i], engine::StorageKind::kOutput, static_cast<uint32_t>(i)));
  }

  // Weights get 256-byte aligned slots; intermediates get arena offsets by
  // lifetime.
  void assign_storage() {
    std::map<int, passes::ArenaRequest> arena;
    for (size_t i = 0; i < plan_.ops.size(); ++i) {
      const passes::PlannedOp& op = plan_.ops[i];
      int op_index = static_cast<int>(i);
      std::vector<int> values = op.reads();
      values.push_back(op.writes());
      for (int v : values) {
        int root = plan_.storage_of(v);
        if (index_.count(root)) continue;
        const ir::Value& value = graph_.value(root);
        if (value.is_constant) {
          uint64_t offset = (desc_.weights.size() + 255) / 256 * 256;
          desc_.weights.resize(offset + value.data.size());
          std::copy(value.data.begin(), value.data.end(), desc_.weights.begin() + static_cast<ptrdiff_t>(offset));
          uint32_t t = add_tensor(root, engine::StorageKind::kWeight, 0);
          desc_.tensors[t].offset = offset;
          continue;
        }
        auto [it, fresh] = arena.try_emplace(root);
        if (fresh) {
          if (v != op.writes() && plan_.storage_of(op.writes()) != root)
            throw CompileError("internal: '" + value.name + "' is read before any op writes it");
          it->second.nbytes = value.nbytes();
          it->second.first_op = op_index;
        }
        it->second.last_op = op_index;
      }
    }
    std::vector<int> roots;
    std::vector<passes::ArenaRequest> requests;
    for (const auto& [root, request] : arena) {
      roots.push_back(root);
      requests.push_back(request);
    }
    passes::ArenaPlan placed = passes::plan_arena(requests);
    desc_.arena_bytes = placed.arena_bytes;
    for (size_t i = 0; i < roots.size(); ++i) {
      uint32_t t = add_tensor(roots[i], engine::StorageKind::kArena, 0);
      desc_.tensors[t].offset = placed.offsets[i];
    }
  }

  const ir::Graph& graph_;
  const passes::ExecPlan& plan_;
  engine::EngineDesc desc_;
  std::map<int, uint32_t> index_;  // storage root value -> tensor index
};

// Depthwise convolutions as generated kernels with their elementwise epilogue
// fused (mobilenet_v3 b8 on the H200: 0.86 -> 0.40 ms with graph replay);
// KILN_DEPTHWISE_KERNEL=0 keeps them on cuDNN.
bool depthwise_kernels_enabled() {
  const char* env = std::getenv("KILN_DEPTHWISE_KERNEL");
  return !(env && std::strcmp(env, "0") == 0);
}

void report(const CompileOptions& options, const std::string& message) {
  if (options.progress) options.progress(message);
}

}  // namespace

engine::EngineDesc compile_to_desc(const ir::Graph& input, const CompileOptions& options) {
  if (options.target_sms.empty()) throw CompileError("target_sms is empty: name at least one SM, e.g. 90");
  for (uint32_t sm : options.target_sms)
    if (sm < 75 || sm > 200)
      throw CompileError("target SM " + std::to_string(sm) + " is out of range (CUDA 13 builds for sm_75 and newer)");
  for (engine::DType d : options.enabled_precisions)
    if (d != engine::DType::kFloat32 && d != engine::DType::kFloat16 && d != engine::DType::kBFloat16)
      throw CompileError(std::string("enabled precision ") + engine::dtype_name(d) + " is not float32, float16 or bfloat16");

  ir::Graph graph = input;
  graph.verify();
  passes::fold_constants(graph);
  graph = passes::fold_batch_norm(graph);
  graph = passes::to_channels_last(graph);
  passes::fold_constants(graph);  // permutes/views of constants the layout pass made
  engine::DType compute = passes::choose_compute_dtype(options.enabled_precisions);
  graph = passes::apply_precision(graph, compute);
  passes::ExecPlan plan = passes::fuse(graph);
  if (depthwise_kernels_enabled()) passes::plan_depthwise_kernels(graph, plan);
  passes::split_reductions(graph, plan);
  int gemms = 0, convs = 0;
  for (const auto& op : plan.ops) {
    gemms += op.kind == passes::PlannedOp::Kind::kGemm;
    convs += op.kind == passes::PlannedOp::Kind::kConv;
  }
  report(options, std::to_string(graph.nodes().size()) + " nodes -> " + std::to_string(gemms) + " GEMMs + " +
                      (convs ? std::to_string(convs) + " convolutions + " : std::string()) +
                      std::to_string(plan.ops.size() - static_cast<size_t>(gemms + convs)) +
                      " fused kernels, computing in " + engine::dtype_name(compute));
  return Lowering(graph, plan).run(options, compute);
}

std::vector<uint8_t> compile_graph(const ir::Graph& graph, const CompileOptions& options) {
  engine::EngineDesc desc = compile_to_desc(graph, options);
  Result<std::vector<uint8_t>> bytes = engine::serialize_engine(desc);
  if (!bytes.is_ok()) throw CompileError("the compiled engine failed validation: " + bytes.status().message());
  report(options, "engine: " + std::to_string(bytes.value().size()) + " bytes (" +
                      std::to_string(desc.weights.size()) + " of weights, arena " +
                      std::to_string(desc.arena_bytes) + " bytes, " + std::to_string(desc.steps.size()) + " steps)");
  return std::move(bytes).value();
}

}  // namespace kiln::compiler
