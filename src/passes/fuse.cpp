// Fusion: walks the graph once and groups nodes into launches. Each op's
// registry entry (ops/op_registry.h) decides its part: views alias their
// input's storage, step ops plan their own steps through PlanContext (a
// matrix product absorbing its ReLU, a conv absorbing bias, residual and
// ReLU), and elementwise ops join chains whose intermediates have one
// consumer into one generated kernel (here: the only op-independent policy).
#include <algorithm>
#include <map>

#include "ops/layout_ops.h"
#include "ops/op_registry.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

std::string short_name(const std::string& op) {
  // "aten.addmm.default" -> "addmm"
  size_t a = op.find('.');
  size_t b = op.find('.', a + 1);
  if (a == std::string::npos) return op;
  return op.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
}

class Fuser final : public ops::PlanContext {
 public:
  Fuser(ir::Graph& graph, const ops::OpOptions& options)
      : graph_(graph), options_(options), consumers_(graph.values().size()),
        is_output_(graph.values().size(), false), absorbed_(graph.nodes().size(), false),
        group_of_(graph.values().size(), -1) {
    for (size_t n = 0; n < graph.nodes().size(); ++n) {
      const ir::Node& node = graph.nodes()[n];
      if (node.op == "kiln.folded") continue;
      for (int in : node.inputs) consumers_[static_cast<size_t>(in)].push_back(static_cast<int>(n));
    }
    for (int id : graph.outputs()) is_output_[static_cast<size_t>(id)] = true;
  }

  ExecPlan run();

  ir::Graph& graph() override { return graph_; }
  const ops::OpOptions& options() const override { return options_; }
  const std::vector<int>& consumers(int value) const override {
    static const std::vector<int> kNone;
    return static_cast<size_t>(value) < consumers_.size() ? consumers_[static_cast<size_t>(value)] : kNone;
  }
  bool is_output(int value) const override {
    return static_cast<size_t>(value) < is_output_.size() && is_output_[static_cast<size_t>(value)];
  }
  bool absorbed(int node) const override { return absorbed_.at(static_cast<size_t>(node)); }
  void absorb(int node) override { absorbed_.at(static_cast<size_t>(node)) = true; }
  void emit(ops::PlannedOp op) override {
    plan_.ops.push_back(std::move(op));
    dead_.push_back(false);
  }
  void emit_at(int node, ops::PlannedOp op) override { deferred_[node].push_back(std::move(op)); }
  void alias(int value, int source) override { plan_.alias_of[value] = plan_.storage_of(source); }

 private:
  bool single_use(int v) const { return consumers(v).size() == 1 && !is_output(v); }
  const ops::PointwisePlan& pointwise(int op) const { return *plan_.ops[static_cast<size_t>(op)].as<ops::PointwisePlan>(); }
  void fuse_elementwise(const ir::Node& node, int n);
  void add_input(ops::PointwisePlan& p, int in);
  void take_inputs(ops::PointwisePlan& p, const ops::PointwisePlan& producer);

  ir::Graph& graph_;
  const ops::OpOptions& options_;
  std::vector<std::vector<int>> consumers_;
  std::vector<bool> is_output_;
  std::vector<bool> absorbed_;
  std::vector<int> group_of_;  // value -> open elementwise op producing it
  std::vector<bool> dead_;     // per plan op, merged into a later one
  // Steps whose fused ops end later in the graph (a conv absorbing a residual
  // add) run at the last absorbed node, when every operand exists.
  std::map<int, std::vector<ops::PlannedOp>> deferred_;
  ExecPlan plan_;
};

// Adds `in` to the kernel's inputs (once). A slice, select or permute result
// (and the chain of them before it) is read from its source storage through
// strides instead: its layout kernel loses its reader and is dropped. Merged
// q/k/v or gate/up projections are so read column by column, and a permute
// feeding arithmetic costs no copy. An alias already costs nothing and keeps
// the kernel's vector loads.
void Fuser::add_input(ops::PointwisePlan& p, int in) {
  if (std::find(p.inputs.begin(), p.inputs.end(), in) != p.inputs.end()) return;
  p.inputs.push_back(in);
  if (plan_.alias_of.count(in)) return;
  ops::PointwisePlan::StridedInput s;
  s.input = in;
  if (ops::strided_source(*this, in, &s.storage, &s.map)) p.strided.push_back(std::move(s));
}

void Fuser::take_inputs(ops::PointwisePlan& p, const ops::PointwisePlan& producer) {
  for (int x : producer.inputs) {
    if (std::find(p.inputs.begin(), p.inputs.end(), x) != p.inputs.end()) continue;
    p.inputs.push_back(x);
    if (const ops::PointwisePlan::StridedInput* s = producer.strided_input(x)) p.strided.push_back(*s);
  }
}

void Fuser::fuse_elementwise(const ir::Node& node, int n) {
  const int out = node.outputs[0];
    ops::PointwisePlan p;
    std::string label;
    for (int in : node.inputs) {
      int g = group_of_[static_cast<size_t>(in)];
      // Same shape, or a short chain (<= 8 ops) on a smaller broadcast operand (e.g. a
      // squeeze-excitation gate [n,1,1,c] scaling [n,h,w,c]): recomputing a
      // few ops per output element is cheaper than a launch and a round trip.
      const bool same_shape = graph_.value(in).shape == graph_.value(out).shape;
      const bool small_broadcast = g >= 0 && pointwise(g).nodes.size() <= 8 &&
                                   graph_.value(in).shape.size() == graph_.value(out).shape.size();
      if (g >= 0 && !dead_[static_cast<size_t>(g)] && single_use(in) && (same_shape || small_broadcast)) {
        const ops::PointwisePlan& producer = pointwise(g);
        p.nodes.insert(p.nodes.end(), producer.nodes.begin(), producer.nodes.end());
        take_inputs(p, producer);
        label += plan_.ops[static_cast<size_t>(g)].label + "+";
        dead_[static_cast<size_t>(g)] = true;
      } else {
        add_input(p, in);
      }
    }
    // A producer with several consumers still fuses when every consumer is
    // now inside this kernel: fp16 SiLU is cast(x) -> sigmoid, mul -> cast,
    // and its leading cast was once a kernel of its own (49 in efficientnet).
    bool merged_shared = false;
    for (int in : node.inputs) {
      int g = group_of_[static_cast<size_t>(in)];
      if (g < 0 || dead_[static_cast<size_t>(g)] || is_output_[static_cast<size_t>(in)]) continue;
      if (graph_.value(in).shape != graph_.value(out).shape) continue;
      bool all_inside = true;
      for (int c : consumers_[static_cast<size_t>(in)])
        all_inside &= c == n || std::find(p.nodes.begin(), p.nodes.end(), c) != p.nodes.end();
      if (!all_inside) continue;
      const ops::PointwisePlan& producer = pointwise(g);
      p.nodes.insert(p.nodes.end(), producer.nodes.begin(), producer.nodes.end());
      take_inputs(p, producer);
      label = plan_.ops[static_cast<size_t>(g)].label + "+" + label;
      dead_[static_cast<size_t>(g)] = true;
      merged_shared = true;
    }
    if (merged_shared) {
      // Graph order is topological, so sorting restores producers-first; the
      // shared values are computed inside now, not read.
      std::sort(p.nodes.begin(), p.nodes.end());
      p.inputs.erase(std::remove_if(p.inputs.begin(), p.inputs.end(),
                                    [&](int v) {
                                      int producer = graph_.value(v).producer;
                                      return producer >= 0 &&
                                             std::find(p.nodes.begin(), p.nodes.end(), producer) != p.nodes.end();
                                    }),
                     p.inputs.end());
    }
    p.nodes.push_back(n);
    p.out = out;
    group_of_[static_cast<size_t>(out)] = static_cast<int>(plan_.ops.size());
    emit(ops::PlannedOp(label + short_name(node.op), std::move(p)));
}

ExecPlan Fuser::run() {
  const size_t node_count = graph_.nodes().size();  // planning may add values and nodes
  for (size_t i = 0; i < node_count; ++i) {
    const int n = static_cast<int>(i);
    if (absorbed_[i]) {
      auto it = deferred_.find(n);
      if (it != deferred_.end()) {
        for (ops::PlannedOp& op : it->second) emit(std::move(op));
        deferred_.erase(it);
      }
      continue;
    }
    const ir::Node node = graph_.nodes()[i];  // copy: the graph may grow below
    if (node.op == "kiln.folded") continue;
    if (node.outputs.empty()) throw CompileError("node '" + node.name + "': has no outputs");
    const ops::OpDef* def = ops::find_op(node.op);
    if (def == nullptr)
      throw CompileError("node '" + node.name + "': " + node.op + " is not supported by the Kiln compiler");
    switch (def->role) {
      case ops::OpRole::kView:
        alias(node.outputs[0], node.inputs.at(0));
        break;
      case ops::OpRole::kStep:
        def->plan(*this, n);
        break;
      case ops::OpRole::kElementwise:
        fuse_elementwise(node, n);
        break;
      case ops::OpRole::kRewritten:
        throw CompileError("internal: node '" + node.name + "' (" + node.op +
                           ") should have been rewritten by an earlier pass");
    }
  }
  if (!deferred_.empty()) throw CompileError("internal: a fused step was never placed");

  // Each graph output gets storage of its own: outputs that are graph inputs,
  // constants, states, or share storage with an earlier output are copied.
  std::vector<int> outputs = graph_.outputs();
  std::vector<bool> taken(graph_.values().size() + outputs.size(), false);
  for (int& id : outputs) {
    int root = plan_.storage_of(id);
    const ir::Value& v = graph_.value(root);
    bool is_input = std::find(graph_.inputs().begin(), graph_.inputs().end(), root) != graph_.inputs().end();
    if (!is_input && !v.is_constant && !v.is_state && !taken[static_cast<size_t>(root)]) {
      taken[static_cast<size_t>(root)] = true;
      continue;
    }
    const ir::Value src = graph_.value(id);
    int node = graph_.add_node("kiln.copy", src.name + "_copy", {id}, {}, {{src.dtype, src.shape}});
    ops::PointwisePlan copy;
    copy.nodes = {node};
    copy.inputs = {id};
    copy.out = graph_.nodes()[static_cast<size_t>(node)].outputs[0];
    id = copy.out;
    emit(ops::PlannedOp("copy", std::move(copy)));
  }
  graph_.set_outputs(outputs);


  // Steps whose result nothing reads are dropped (e.g. the x^2 kernel of
  // an RMSNorm its row step replaced), last to first so their inputs' steps
  // can follow them.
  std::vector<bool> needed(graph_.values().size(), false);
  for (int id : graph_.outputs()) needed[static_cast<size_t>(plan_.storage_of(id))] = true;
  for (const ir::State& st : graph_.states())  // an in-place update is a result too
    if (st.update >= 0) needed[static_cast<size_t>(plan_.storage_of(st.update))] = true;
  for (size_t i = plan_.ops.size(); i-- > 0;) {
    if (dead_[i]) continue;
    bool any = false;
    for (int w : plan_.ops[i].all_writes()) any = any || needed[static_cast<size_t>(plan_.storage_of(w))];
    if (!any) {
      dead_[i] = true;
      continue;
    }
    for (int r : plan_.ops[i].reads()) needed[static_cast<size_t>(plan_.storage_of(r))] = true;
  }

  ExecPlan live;
  live.alias_of = plan_.alias_of;
  for (size_t i = 0; i < plan_.ops.size(); ++i)
    if (!dead_[i]) live.ops.push_back(std::move(plan_.ops[i]));
  return live;
}

}  // namespace

ExecPlan fuse(ir::Graph& graph, const ops::OpOptions& options) { return Fuser(graph, options).run(); }

}  // namespace kiln::passes
