// The compiler pipeline: the named passes (passes() below: verify, fold
// constants, fold batch norm, channels-last, precision, fuse, ...), then
// memory planning and lowering (each planned step lowers itself, see
// ops/step_plan.h), NVRTC, serialization. Progress goes through
// CompileOptions::progress; debug_dir dumps the state after each pass.
#include "compiler/compiler.h"
#include "compiler/input_bounds.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "codegen/nvrtc_compiler.h"
#include "engine_format/engine_format.h"
#include "ops/elementwise_kernel.h"
#include "ops/step_plan.h"
#include "ops/decode_layers_ops.h"
#include "passes/passes.h"

namespace kiln::compiler {
namespace {

// The SMs that get a cubin (CompileOptions::cubin_sms, checked by
// check_cubin_sms): the given list, else one per target SM.
std::vector<uint32_t> cubin_sms(const CompileOptions& options) {
  std::vector<uint32_t> sms = options.cubin_sms.empty() ? options.target_sms : options.cubin_sms;
  std::sort(sms.begin(), sms.end());
  sms.erase(std::unique(sms.begin(), sms.end()), sms.end());
  return sms;
}

void check_cubin_sms(const CompileOptions& options) {
  const std::vector<uint32_t>& targets = options.target_sms;
  for (uint32_t sm : options.cubin_sms)
    if (std::find(targets.begin(), targets.end(), sm) == targets.end())
      throw CompileError("cubin SM " + std::to_string(sm) + " is not one of target_sms");
  if (options.cubin_sms.empty()) return;
  for (uint32_t sm : targets) {
    bool covered = false;
    for (uint32_t c : options.cubin_sms) covered |= c / 10 == sm / 10 && c <= sm;
    if (!covered)
      throw CompileError("target SM " + std::to_string(sm) + " has no cubin: cubin_sms must hold sm_" +
                         std::to_string(sm) + " or an older minor of sm_" + std::to_string(sm / 10) + "x");
  }
}

class Lowering final : public ops::LowerContext {
 public:
  Lowering(const ir::Graph& graph, const passes::ExecPlan& plan) : graph_(graph), plan_(plan) {}

  engine::EngineDesc run(const CompileOptions& options, engine::DType compute) {
    add_states();
    add_io_tensors();
    assign_storage();
    source_ = ops::pointwise_prelude();
    for (const ops::PlannedOp& op : plan_.ops) {
      engine::Step step;
      step.label = op.label;
      op.plan->lower(*this, step);
      if (step.kind == engine::StepKind::kKernel) {
        auto alias = same_as_.find(step.kernel.function);
        if (alias != same_as_.end()) step.kernel.function = alias->second;
      }
      desc_.steps.push_back(std::move(step));
    }
    if (kernels_ > 0) {
      if (options.progress) {
        std::ostringstream msg;
        msg << "generating " << kernels_ << " fused kernel" << (kernels_ == 1 ? "" : "s");
        if (distinct_ < kernels_) msg << " (" << distinct_ << " distinct)";
        msg << " with NVRTC for";
        for (uint32_t sm : cubin_sms(options)) msg << " sm_" << sm;
        if (options.emit_ptx) msg << " + PTX";
        options.progress(msg.str());
      }
      // The modules and then their SMs compile in parallel; a module
      // compiled before in this process (a re-proposed trial, a re-lowering)
      // comes from NVRTC's cache.
      std::vector<codegen::ModuleSource> modules = split_modules();
      desc_.modules = codegen::compile_modules(modules, cubin_sms(options), options.emit_ptx, options.progress,
                                               options.overlap_launches);
      for (engine::Step& step : desc_.steps)
        if (step.kind == engine::StepKind::kKernel) {
          auto it = module_of_.find(step.kernel.function);
          const bool own = std::any_of(own_modules_.begin(), own_modules_.end(),
                                       [&](const OwnModule& m) { return m.name == step.kernel.function; });
          if (own) continue;  // compile_own_modules places it
          if (it == module_of_.end())
            throw CompileError("internal: step '" + step.label + "' launches '" + step.kernel.function +
                               "', which no generated source defines");
          step.kernel.module = it->second;
        }
    }
    compile_own_modules(options);
    std::ostringstream sms;
    for (size_t i = 0; i < options.target_sms.size(); ++i) sms << (i ? "," : "") << options.target_sms[i];
    desc_.metadata.emplace_back("precision", engine::dtype_name(compute));
    desc_.metadata.emplace_back("target_sms", sms.str());
    desc_.metadata.emplace_back("nvrtc", codegen::nvrtc_version());
    desc_.metadata.emplace_back("source_nodes", std::to_string(graph_.nodes().size()));
    desc_.metadata.emplace_back("conv_gemm", ops::conv_gemm_name(options.op_options.conv_gemm));
    desc_.metadata.emplace_back("depthwise_kernels", options.op_options.depthwise_kernels ? "true" : "false");
    desc_.metadata.emplace_back("gemv_kernels", options.op_options.gemv_kernels ? "true" : "false");
    if (options.op_options.persistent_decode) {
      desc_.metadata.emplace_back("persistent_decode", "true");
      desc_.metadata.emplace_back("persistent_decode_options", ops::decode_layers_options_text(options.op_options.decode_layers));
    }
    // Read by the runtime: launch the sm_90+ cubins' kernels programmatically.
    desc_.metadata.emplace_back("overlap_launches", options.overlap_launches ? "true" : "false");
    if (options.use_cuda_graphs >= 0)
      desc_.metadata.emplace_back("use_cuda_graphs", options.use_cuda_graphs ? "true" : "false");
    return std::move(desc_);
  }

  void add_module_source(const std::string& name, const std::string& source, uint32_t min_sm) override {
    pending_.clear();
    ++distinct_;
    source_ += "\n" + source;
    own_modules_.push_back({name, source, min_sm});
  }

  uint32_t add_derived_weight(engine::DerivedWeight weight, engine::DType dtype, std::vector<int64_t> shape) override {
    engine::TensorDesc t;
    t.name = weight.name;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.storage = engine::StorageKind::kDerivedWeight;
    t.io_index = static_cast<uint32_t>(desc_.derived_weights.size());
    t.nbytes = engine::dtype_size(dtype);
    for (int64_t d : t.shape) t.nbytes *= static_cast<uint64_t>(d);
    if (t.nbytes != weight.nbytes)
      throw CompileError("internal: derived weight '" + weight.name + "' of " + std::to_string(weight.nbytes) +
                         " bytes given a tensor of " + std::to_string(t.nbytes));
    desc_.derived_weights.push_back(std::move(weight));
    desc_.tensors.push_back(std::move(t));
    return static_cast<uint32_t>(desc_.tensors.size() - 1);
  }

  uint32_t add_state(const std::string& key, uint64_t nbytes) override {
    for (const engine::StateDesc& s : desc_.states)
      if (s.key == key) throw CompileError("internal: state key '" + key + "' is taken");
    engine::TensorDesc t;
    t.name = key;
    t.dtype = engine::DType::kInt32;
    t.shape = {static_cast<int64_t>((nbytes + 3) / 4)};
    t.storage = engine::StorageKind::kState;
    t.io_index = static_cast<uint32_t>(desc_.states.size());
    t.nbytes = static_cast<uint64_t>(t.shape[0]) * 4;
    desc_.states.push_back(engine::StateDesc{key, t.nbytes, {}});
    desc_.tensors.push_back(std::move(t));
    return static_cast<uint32_t>(desc_.tensors.size() - 1);
  }

  const ir::Graph& graph() const override { return graph_; }
  // Every kernel's CUDA source, as compiled (empty before run()).
  const std::string& kernel_source() const { return source_; }
  std::string kernel_name(const std::string& prefix) override {
    pending_ = prefix + "_" + std::to_string(kernels_++);
    return pending_;
  }
  // A kernel whose source is an earlier one's but for its name (and
  // comments) is not added: its step launches the earlier function, the
  // same code, and NVRTC compiles it once (densenet's hundreds of layout
  // and concat copies are a few hundred distinct kernels).
  void add_source(const std::string& source) override {
    std::string name;
    std::swap(name, pending_);
    if (!name.empty() && source.find(name + "(") != std::string::npos) {
      auto [it, fresh] = first_with_body_.try_emplace(normalized(source, name), name);
      if (!fresh) {
        same_as_[name] = it->second;
        return;
      }
    }
    ++distinct_;
    source_ += "\n" + source;
    if (name.empty())
      shared_ += "\n" + source;  // no kernel of its own: every module gets it
    else
      units_.push_back({name, source});
  }

 private:
  uint32_t tensor(int value) const override {
    auto it = index_.find(plan_.storage_of(value));
    if (it == index_.end()) throw CompileError("internal: value '" + graph_.value(value).name + "' has no storage");
    return it->second;
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

  // Each state: its StateDesc (key, size, initial value) and one kState
  // tensor covering it, which every alias of the state (its in-place
  // updates) shares.
  void add_states() {
    for (size_t i = 0; i < graph_.states().size(); ++i) {
      const ir::State& s = graph_.states()[i];
      const ir::Value& v = graph_.value(s.value);
      desc_.states.push_back(engine::StateDesc{s.key, v.nbytes(), v.data});
      add_tensor(s.value, engine::StorageKind::kState, static_cast<uint32_t>(i));
    }
  }

  void add_io_tensors() {
    for (size_t i = 0; i < graph_.inputs().size(); ++i)
      desc_.inputs.push_back(add_tensor(graph_.inputs()[i], engine::StorageKind::kInput, static_cast<uint32_t>(i)));
    for (size_t i = 0; i < graph_.outputs().size(); ++i)
      desc_.outputs.push_back(add_tensor(graph_.outputs()[i], engine::StorageKind::kOutput, static_cast<uint32_t>(i)));
  }

  // The weights blob's final size, reserved before assign_storage fills it in
  // the same order: growing it a constant at a time reallocated and copied
  // the blob again at each doubling.
  void reserve_weights() {
    std::set<int> seen;
    uint64_t bytes = desc_.weights.size();
    for (const passes::PlannedOp& op : plan_.ops)
      for (int v : op.reads()) {  // a constant is only ever read
        const int root = plan_.storage_of(v);
        const ir::Value& value = graph_.value(root);
        if (!value.is_constant || index_.count(root) || !seen.insert(root).second) continue;
        bytes = weight_slot(bytes) + value.data.size();
      }
    desc_.weights.reserve(bytes);
  }

  // Where the next weight starts after `end` bytes of the blob: 256-byte aligned.
  static uint64_t weight_slot(uint64_t end) { return (end + 255) / 256 * 256; }

  // Weights get 256-byte aligned slots; intermediates get arena offsets by
  // lifetime.
  void assign_storage() {
    reserve_weights();
    std::map<int, passes::ArenaRequest> arena;
    for (size_t i = 0; i < plan_.ops.size(); ++i) {
      const passes::PlannedOp& op = plan_.ops[i];
      int op_index = static_cast<int>(i);
      std::vector<int> values = op.reads();
      const std::vector<int> writes = op.all_writes();
      values.insert(values.end(), writes.begin(), writes.end());
      auto written = [&](int root) {
        for (int w : writes)
          if (plan_.storage_of(w) == root) return true;
        return false;
      };
      for (int v : values) {
        int root = plan_.storage_of(v);
        if (index_.count(root)) continue;
        const ir::Value& value = graph_.value(root);
        if (value.is_constant) {
          // Appended, not resized then copied: a resize zero-fills what the
          // copy overwrites, hundreds of MB for a language model.
          const uint64_t offset = weight_slot(desc_.weights.size());
          desc_.weights.insert(desc_.weights.end(), offset - desc_.weights.size(), uint8_t{0});
          desc_.weights.insert(desc_.weights.end(), value.data.begin(), value.data.end());
          uint32_t t = add_tensor(root, engine::StorageKind::kWeight, 0);
          desc_.tensors[t].offset = offset;
          continue;
        }
        auto [it, fresh] = arena.try_emplace(root);
        if (fresh) {
          if (!written(root))
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

  // The kernels as modules: one ("kiln_kernels") up to kKernelsPerModule
  // distinct kernels, else up to kMaxModules ("kiln_kernels_0", ...) of about
  // equal source size, each with the prelude, so NVRTC and ptxas run on
  // several cores (densenet201: 320 distinct kernels). The split depends on
  // the kernels only, never on the machine: the same graph gives the same
  // engine everywhere.
  // The kernels that asked for a module of their own (add_module_source): each compiled for the
  // targeted SMs it allows, without the grid-dependency patch.
  void compile_own_modules(const CompileOptions& options) {
    for (const OwnModule& m : own_modules_) {
      std::vector<uint32_t> sms;
      for (uint32_t sm : cubin_sms(options))
        if (sm >= m.min_sm) sms.push_back(sm);
      if (sms.empty())
        throw CompileError("kernel '" + m.name + "' needs sm_" + std::to_string(m.min_sm) +
                           " or newer, and no target SM is");
      module_of_[m.name] = static_cast<uint32_t>(desc_.modules.size());
      desc_.modules.push_back(codegen::compile_module(m.name, m.source, sms, options.emit_ptx, options.progress, false));
    }
    for (engine::Step& step : desc_.steps)
      if (step.kind == engine::StepKind::kKernel) {
        auto it = module_of_.find(step.kernel.function);
        if (it != module_of_.end()) step.kernel.module = it->second;
      }
  }

  std::vector<codegen::ModuleSource> split_modules() {
    constexpr size_t kKernelsPerModule = 64, kMaxModules = 4;
    const size_t count = std::min(kMaxModules, std::max<size_t>(1, units_.size() / kKernelsPerModule));
    std::vector<codegen::ModuleSource> modules(count);
    std::vector<size_t> bytes(count, 0);
    const std::string prelude = ops::pointwise_prelude() + shared_;
    for (size_t i = 0; i < count; ++i) {
      modules[i].name = count == 1 ? "kiln_kernels" : "kiln_kernels_" + std::to_string(i);
      modules[i].source = prelude;
    }
    for (const auto& [name, source] : units_) {
      const size_t m = static_cast<size_t>(std::min_element(bytes.begin(), bytes.end()) - bytes.begin());
      bytes[m] += source.size();
      modules[m].source += "\n" + source;
      module_of_[name] = static_cast<uint32_t>(m);
    }
    return modules;
  }

  const ir::Graph& graph_;
  const passes::ExecPlan& plan_;
  engine::EngineDesc desc_;
  std::map<int, uint32_t> index_;  // storage root value -> tensor index
  // `source` with `name` replaced by a mark and // comments dropped: equal
  // for two kernels that differ only in those.
  static std::string normalized(const std::string& source, const std::string& name) {
    std::string out;
    out.reserve(source.size());
    for (size_t i = 0; i < source.size();) {
      if (source.compare(i, name.size(), name) == 0) {
        out += '\x01';
        i += name.size();
      } else if (source.compare(i, 2, "//") == 0) {
        while (i < source.size() && source[i] != '\n') ++i;
      } else {
        out += source[i++];
      }
    }
    return out;
  }

  std::string source_;             // every generated kernel, in order (debug_dir's dump)
  std::vector<std::pair<std::string, std::string>> units_;  // each distinct kernel: function, source
  struct OwnModule {
    std::string name, source;
    uint32_t min_sm = 0;
  };
  std::vector<OwnModule> own_modules_;  // kernels in modules of their own (add_module_source)
  std::string shared_;             // sources that define no kernel (helpers)
  std::map<std::string, uint32_t> module_of_;  // function -> its module (split_modules)
  int kernels_ = 0;                // kernel names handed out
  int distinct_ = 0;               // kernels in source_
  std::string pending_;            // the name kernel_name() gave last, until its source comes
  std::map<std::string, std::string> first_with_body_;  // normalized source -> first function
  std::map<std::string, std::string> same_as_;          // function -> earlier identical function
};

void report(const CompileOptions& options, const std::string& message) {
  if (options.progress) options.progress(message);
}

// The pass pipeline: named passes in order over one state (the graph, and
// the step plan from fusion on). compile_to_desc runs them and, with
// CompileOptions::debug_dir, dumps the state after each.
struct PassState {
  ir::Graph graph;
  passes::ExecPlan plan;
  bool planned = false;
};

struct Pass {
  const char* name;
  std::function<void(PassState&, const CompileOptions&, engine::DType compute)> run;
};

// Every value a step reads holds data by then: a graph input, a constant,
// or (the storage of) what an earlier step wrote. A pass that loses track
// of a value would otherwise leave a step reading an arena slot nobody
// writes: a silent wrong answer.
void check_plan_reads(const ir::Graph& graph, const passes::ExecPlan& plan) {
  std::set<int> ready(graph.inputs().begin(), graph.inputs().end());
  for (const ir::Value& v : graph.values())
    if (v.is_constant || v.is_state) ready.insert(v.id);
  for (const ops::PlannedOp& op : plan.ops) {
    for (int r : op.reads()) {
      if (ready.count(r) || ready.count(plan.storage_of(r))) continue;
      throw CompileError("internal: step '" + op.label + "' reads " + graph.value(r).name +
                         ", which no earlier step writes (a compiler pass lost it)");
    }
    for (int w : op.all_writes()) {
      ready.insert(w);
      ready.insert(plan.storage_of(w));
    }
  }
}

const std::vector<Pass>& passes() {
  static const std::vector<Pass> kPasses = {
      {"verify", [](PassState& s, const CompileOptions&, engine::DType) { s.graph.verify(); }},
      {"fold_constants", [](PassState& s, const CompileOptions&, engine::DType) { passes::fold_constants(s.graph); }},
      {"splits_to_slices",
       [](PassState& s, const CompileOptions&, engine::DType) { s.graph = passes::splits_to_slices(s.graph); }},
      {"common_subexpressions",
       [](PassState& s, const CompileOptions&, engine::DType) { s.graph = passes::merge_common_subexpressions(s.graph); }},
      {"fold_batch_norm",
       [](PassState& s, const CompileOptions&, engine::DType) { s.graph = passes::fold_batch_norm(s.graph); }},
      {"patchify_conv",
       [](PassState& s, const CompileOptions& o, engine::DType) {
         s.graph = passes::patchify_convolutions(s.graph, o.op_options);
       }},
      {"channels_last",
       [](PassState& s, const CompileOptions&, engine::DType) { s.graph = passes::to_channels_last(s.graph); }},
      // permutes/views of constants the layout pass made
      {"fold_layout_constants",
       [](PassState& s, const CompileOptions&, engine::DType) { passes::fold_constants(s.graph); }},
      {"precision",
       [](PassState& s, const CompileOptions&, engine::DType c) { s.graph = passes::apply_precision(s.graph, c); }},
      {"fuse_attention", [](PassState& s, const CompileOptions&, engine::DType) { passes::fuse_attention(s.graph); }},
      {"fuse_rotary", [](PassState& s, const CompileOptions&, engine::DType) { passes::fuse_rotary(s.graph); }},
      {"merge_linears",
       [](PassState& s, const CompileOptions&, engine::DType) { s.graph = passes::merge_sibling_linears(s.graph); }},
      {"linear_permutes",
       [](PassState& s, const CompileOptions&, engine::DType) { s.graph = passes::commute_linear_permutes(s.graph); }},
      {"attention_layout",
       [](PassState& s, const CompileOptions&, engine::DType) { passes::attention_operand_layouts(s.graph); }},
      {"fuse",
       [](PassState& s, const CompileOptions& o, engine::DType) {
         ops::OpOptions op_options = o.op_options;
         op_options.min_target_sm = static_cast<int>(*std::min_element(o.target_sms.begin(), o.target_sms.end()));
         op_options.overlap_launches = o.overlap_launches;
         s.plan = passes::fuse(s.graph, op_options);
         s.planned = true;
       }},
      {"depthwise_kernels",
       [](PassState& s, const CompileOptions& o, engine::DType) {
         if (o.op_options.depthwise_kernels) passes::plan_depthwise_kernels(s.graph, s.plan);
       }},
      {"gemv_pair_epilogues",
       [](PassState& s, const CompileOptions&, engine::DType) { passes::plan_gemv_pair_epilogues(s.graph, s.plan); }},
      {"split_reductions",
       [](PassState& s, const CompileOptions&, engine::DType) {
         passes::split_reductions(s.graph, s.plan);
       }},
      {"group_launches",
       [](PassState& s, const CompileOptions&, engine::DType) {
         passes::group_launches(s.plan);
       }},
      {"gemv_loop_epilogues",
       [](PassState& s, const CompileOptions&, engine::DType) {
         passes::plan_gemv_loop_epilogues(s.graph, s.plan);
         check_plan_reads(s.graph, s.plan);
       }},
      {"fold_decode_layers",
       [](PassState& s, const CompileOptions& o, engine::DType) {
         if (!o.op_options.persistent_decode) return;
         ops::OpOptions op_options = o.op_options;
         op_options.min_target_sm = static_cast<int>(*std::min_element(o.target_sms.begin(), o.target_sms.end()));
         std::string why;
         const int removed = passes::fold_decode_layers(s.graph, s.plan, op_options, &why);
         bool head = false, embed = false;
         for (const ops::PlannedOp& op : s.plan.ops)
           if (const auto* dl = op.as<ops::DecodeLayersPlan>()) head = dl->shape.vocab > 0, embed = dl->shape.embed_rows > 0;
         if (o.progress)
           o.progress(removed > 0 ? std::string("persistent_decode: ") + (embed ? "the embedding, " : "") +
                                        "the decode layers" +
                                        (head ? " and the head (final norm, lm_head, argmax)" : "") +
                                        " are one persistent kernel (" + std::to_string(removed + 1) + " steps -> 1)"
                                  : "persistent_decode: not applied: " + why);
         check_plan_reads(s.graph, s.plan);
       }},
  };
  return kPasses;
}

std::string describe_plan(const ir::Graph& graph, const passes::ExecPlan& plan) {
  std::ostringstream out;
  auto name = [&](int v) { return graph.value(v).name; };
  for (size_t i = 0; i < plan.ops.size(); ++i) {
    const ops::PlannedOp& op = plan.ops[i];
    out << "step " << i << " " << op.label << ":";
    for (int w : op.all_writes()) out << " " << name(w);
    out << " <-";
    for (int r : op.reads()) out << " " << name(r);
    out << "\n";
  }
  for (const auto& [view, root] : plan.alias_of) out << "view " << name(view) << " = storage of " << name(root) << "\n";
  return out.str();
}

class Pipeline {
 public:
  Pipeline(const ir::Graph& input, const CompileOptions& options) : options_(options) {
    state.graph = input;
    if (!options.debug_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(options.debug_dir, ec);
      if (ec) throw CompileError("debug_dir '" + options.debug_dir + "' cannot be created: " + ec.message());
      write("00_input.txt", state.graph.describe());
    }
  }

  void dump(const std::string& pass) {
    if (options_.debug_dir.empty()) return;
    std::string text = state.graph.describe();
    if (state.planned) text += "\n# step plan\n" + describe_plan(state.graph, state.plan);
    write(next_prefix() + pass + ".txt", text);
  }

  // The lowered steps, and the CUDA source NVRTC compiled (NN_kernels.cu).
  void dump_steps(const engine::EngineDesc& desc, const std::string& kernel_source) {
    if (options_.debug_dir.empty()) return;
    if (!kernel_source.empty()) write(next_prefix() + "kernels.cu", kernel_source);
    std::ostringstream out;
    for (size_t i = 0; i < desc.steps.size(); ++i) {
      const engine::Step& s = desc.steps[i];
      out << "step " << i << " " << s.label << ": "
          << (s.kind == engine::StepKind::kGemm ? "gemm" : s.kind == engine::StepKind::kConv ? "conv" : s.kernel.function)
          << "\n";
    }
    out << "arena " << desc.arena_bytes << " bytes, weights " << desc.weights.size() << " bytes\n";
    write(next_prefix() + "lower.txt", out.str());
  }

  PassState state;

 private:
  std::string next_prefix() {
    char buffer[16];  // "NN_" for any int count
    std::snprintf(buffer, sizeof(buffer), "%02d_", ++count_);
    return buffer;
  }
  void write(const std::string& file, const std::string& text) const {
    const std::string path = options_.debug_dir + "/" + file;
    std::ofstream out(path);
    out << text;
    if (!out) throw CompileError("debug_dir: cannot write " + path);
  }

  const CompileOptions& options_;
  int count_ = 0;
};

// The index inputs' bounds (input_bounds.h): found on the graph as it came (before passes fuse
// the index ops away), then narrowed by the steps that took their place (the persistent decode
// kernel's positions), matched to the engine's inputs by name.
void record_input_bounds(const ir::Graph& input, const ir::Graph& planned, const passes::ExecPlan& plan,
                         engine::EngineDesc* desc) {
  std::map<uint32_t, engine::InputBound> bounds;  // by engine input
  auto add = [&](const std::string& name, int64_t lo, int64_t hi, const std::string& what) {
    for (uint32_t e = 0; e < desc->inputs.size(); ++e) {
      if (desc->tensors[desc->inputs[e]].name != name) continue;
      auto [it, fresh] = bounds.try_emplace(e, engine::InputBound{e, lo, hi, what});
      if (!fresh) intersect_bound(it->second, lo, hi, what);
      return;
    }
  };
  for (const engine::InputBound& b : input_index_bounds(input))
    add(input.value(input.inputs()[b.input]).name, b.lo, b.hi, b.what);
  for (const ops::PlannedOp& op : plan.ops)
    for (const ops::ValueRange& r : op.plan->index_ranges())
      if (std::find(planned.inputs().begin(), planned.inputs().end(), r.value) != planned.inputs().end())
        add(planned.value(r.value).name, r.lo, r.hi, r.what);
  std::vector<engine::InputBound> kept;
  for (auto& [e, b] : bounds)
    if (b.lo < b.hi) kept.push_back(std::move(b));
  if (!kept.empty()) desc->metadata.emplace_back(engine::kInputBoundsKey, engine::format_input_bounds(kept));
}

}  // namespace

engine::EngineDesc compile_to_desc(const ir::Graph& input, const CompileOptions& options) {
  if (options.target_sms.empty()) throw CompileError("target_sms is empty: name at least one SM, e.g. 90");
  for (uint32_t sm : options.target_sms)
    if (sm < 75 || sm > 200)
      throw CompileError("target SM " + std::to_string(sm) + " is out of range (CUDA 13 builds for sm_75 and newer)");
  check_cubin_sms(options);
  for (engine::DType d : options.enabled_precisions)
    if (d != engine::DType::kFloat32 && d != engine::DType::kFloat16 && d != engine::DType::kBFloat16)
      throw CompileError(std::string("enabled precision ") + engine::dtype_name(d) + " is not float32, float16 or bfloat16");

  Pipeline pipeline(input, options);
  engine::DType compute = passes::choose_compute_dtype(options.enabled_precisions);
  for (const Pass& pass : passes()) {
    pass.run(pipeline.state, options, compute);
    pipeline.dump(pass.name);
  }
  passes::ExecPlan& plan = pipeline.state.plan;
  ir::Graph& graph = pipeline.state.graph;
  int gemms = 0, convs = 0;
  for (const auto& op : plan.ops) {
    gemms += op.is<ops::GemmPlan>();
    convs += op.is<ops::ConvPlan>();
  }
  report(options, std::to_string(graph.nodes().size()) + " nodes -> " + std::to_string(gemms) + " GEMMs + " +
                      (convs ? std::to_string(convs) + " convolutions + " : std::string()) +
                      std::to_string(plan.ops.size() - static_cast<size_t>(gemms + convs)) +
                      " fused kernels, computing in " + engine::dtype_name(compute));
  Lowering lowering(graph, plan);
  engine::EngineDesc desc = lowering.run(options, compute);
  record_input_bounds(input, graph, plan, &desc);
  pipeline.dump_steps(desc, lowering.kernel_source());
  return desc;
}

std::vector<std::string> pass_names() {
  std::vector<std::string> names;
  for (const Pass& p : passes()) names.push_back(p.name);
  return names;
}

std::vector<uint8_t> compile_graph(const ir::Graph& graph, const CompileOptions& options,
                                   std::vector<engine::ExternalWeight>* weights) {
  engine::EngineDesc desc = compile_to_desc(graph, options);
  const size_t weight_bytes = desc.weights.size();
  if (weights != nullptr) weights->clear();
  if (!options.weights_named_as.empty()) {
    Result<std::vector<std::vector<uint8_t>>> named = engine::externalize_weights(&desc, options.weights_named_as);
    if (!named.is_ok()) throw CompileError("naming the engine's weights: " + named.status().message());
    if (weights != nullptr) *weights = engine::external_weights(desc, std::move(named).value());
  }
  Result<std::vector<uint8_t>> bytes = engine::serialize_engine(desc);
  if (!bytes.is_ok()) throw CompileError("the compiled engine failed validation: " + bytes.status().message());
  report(options, "engine: " + std::to_string(bytes.value().size()) + " bytes (" +
                      std::to_string(weight_bytes) + " of weights" +
                      (options.weights_named_as.empty() ? "" : weights != nullptr ? ", named" : ", named, not stored") + ", arena " +
                      std::to_string(desc.arena_bytes) + " bytes, " + std::to_string(desc.steps.size()) + " steps)");
  return std::move(bytes).value();
}

}  // namespace kiln::compiler
