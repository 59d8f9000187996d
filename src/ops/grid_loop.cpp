#include "ops/grid_loop.h"

#include <algorithm>
#include <sstream>

#include "codegen/cuda_dtype.h"
#include "ir/graph.h"

namespace kiln::ops {
namespace {

using codegen::ll;

// `decl` without __restrict__ when `keep` is false.
std::string restricted(std::string decl, bool keep) {
  const std::string r = " __restrict__";
  if (!keep)
    for (size_t at = decl.find(r); at != std::string::npos; at = decl.find(r)) decl.erase(at, r.size());
  return decl;
}

// The loop over iterations [0, count) by `blocks` blocks, the first at block `first`.
void emit_loop(std::ostringstream& s, const GridLoop& loop, const std::string& block, int64_t blocks,
               const std::string& indent) {
  s << indent << "for (long long i = (long long)(" << block << ") * " << kGridLoopBlock << " + threadIdx.x; i < "
    << ll(loop.count) << "; i += " << ll(blocks * kGridLoopBlock) << ") {\n"
    << loop.body << indent << "}\n";
}

}  // namespace

bool is_grid_loop(const PlannedOp& op) { return dynamic_cast<const GridLoopStep*>(op.plan.get()) != nullptr; }

const GridLoopStep& grid_loop_step(const PlannedOp& op) {
  const auto* s = dynamic_cast<const GridLoopStep*>(op.plan.get());
  if (s == nullptr) throw CompileError("internal: step '" + op.label + "' is not a grid loop");
  return *s;
}

std::vector<std::string> grid_loop_member_params(const GridLoop& loop, size_t member, bool keep_restrict) {
  std::vector<std::string> decls;
  for (const GridLoop::Param& p : loop.params)
    decls.push_back(restricted(p.decl, keep_restrict) + " m" + std::to_string(member) + "_" + p.name);
  return decls;
}

std::string grid_loop_member_bindings(const GridLoop& loop, size_t member, const std::string& indent,
                                      bool keep_restrict) {
  std::ostringstream s;
  for (const GridLoop::Param& p : loop.params)
    s << indent << restricted(p.decl, keep_restrict) << " " << p.name << " = m" << member << "_" << p.name << ";\n";
  return s.str();
}

uint32_t grid_loop_blocks(int64_t count) {
  return static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(1, (count + kGridLoopBlock - 1) / kGridLoopBlock), 65536));
}

void lower_grid_loop(LowerContext& ctx, engine::Step& step, const std::string& prefix, const GridLoop& loop) {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name(prefix);
  const uint32_t blocks = grid_loop_blocks(loop.count);
  std::ostringstream s;
  s << "extern \"C\" __global__ void __launch_bounds__(" << kGridLoopBlock << ") " << k.function << "(";
  for (size_t j = 0; j < loop.params.size(); ++j)
    s << (j ? ",\n    " : "\n    ") << loop.params[j].decl << " " << loop.params[j].name;
  s << ") {\n";
  emit_loop(s, loop, "blockIdx.x", blocks, "  ");
  s << "}\n";
  ctx.add_source(s.str());
  k.grid[0] = blocks;
  k.block[0] = kGridLoopBlock;
  k.args.clear();
  for (const GridLoop::Param& p : loop.params) k.args.push_back(p.arg);
}

std::vector<int> LaunchGroupPlan::reads() const {
  std::vector<int> r;
  for (const PlannedOp& m : members)
    for (int v : m.reads())
      if (std::find(r.begin(), r.end(), v) == r.end()) r.push_back(v);
  return r;
}

std::vector<int> LaunchGroupPlan::also_writes() const {
  std::vector<int> w;
  for (size_t j = 0; j < members.size(); ++j) {
    if (j > 0) w.push_back(members[j].writes());
    for (int v : members[j].plan->also_writes()) w.push_back(v);
  }
  return w;
}

void LaunchGroupPlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_launch_group");
  std::vector<GridLoop> loops;
  for (const PlannedOp& m : members) loops.push_back(grid_loop_step(m).grid_loop(ctx));
  std::ostringstream s;
  // Member m's parameters are m<m>_<name>; its block range binds them back
  // to the names its body uses.
  s << "extern \"C\" __global__ void __launch_bounds__(" << kGridLoopBlock << ") " << k.function << "(";
  bool first_param = true;
  k.args.clear();
  for (size_t m = 0; m < loops.size(); ++m) {
    for (const std::string& decl : grid_loop_member_params(loops[m], m, true)) {
      s << (first_param ? "\n    " : ",\n    ") << decl;
      first_param = false;
    }
    for (const GridLoop::Param& p : loops[m].params) k.args.push_back(p.arg);
  }
  s << ") {\n  const long long b = blockIdx.x;\n";
  int64_t first = 0;
  for (size_t m = 0; m < loops.size(); ++m) {
    const int64_t blocks = grid_loop_blocks(loops[m].count);
    s << "  if (b < " << ll(first + blocks) << ") {  // " << members[m].label << "\n"
      << grid_loop_member_bindings(loops[m], m, "    ", true);
    emit_loop(s, loops[m], first ? "b - " + ll(first) : "b", blocks, "    ");
    s << "    return;\n  }\n";
    first += blocks;
  }
  s << "}\n";
  if (first > 0x7fffffffLL) throw CompileError("internal: launch group of " + std::to_string(first) + " blocks");
  ctx.add_source(s.str());
  k.grid[0] = static_cast<uint32_t>(first);
  k.block[0] = kGridLoopBlock;
}

}  // namespace kiln::ops
