#include "ops/attention_ops.h"

#include <cmath>
#include <optional>

#include "ops/attention_kernel.h"
#include "ops/op_registry.h"
#include "ops/view_ops.h"

namespace kiln::ops {
namespace {

using Shape = std::vector<int64_t>;

const char* kOperands[] = {"q", "k", "v", "mask"};


bool attr_true(const std::map<std::string, ir::Attr>& attrs, const std::string& key) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return false;
  if (auto* b = std::get_if<bool>(&it->second)) return *b;
  if (auto* i = std::get_if<int64_t>(&it->second)) return *i != 0;
  return false;
}

// [batch, heads, rows, dim] from a rank-3 ([batch, rows, dim]) or rank-4 shape.
Shape as_bhld(const Shape& s) { return s.size() == 3 ? Shape{s[0], 1, s[1], s[2]} : s; }
Shape strides_bhld(const Shape& st) { return st.size() == 3 ? Shape{st[0], 0, st[1], st[2]} : st; }

struct Operands {
  Shape q, k, v, mask;  // logical shapes (mask empty when absent)
  bool has_mask = false;
  bool gqa = false;
};

// Empty when the shapes form an attention Kiln computes, else why not.
std::string validate(const Operands& o) {
  if (o.q.size() != 3 && o.q.size() != 4) return "attention on rank-" + std::to_string(o.q.size()) + " tensors (Kiln takes rank 3 or 4)";
  if (o.k.size() != o.q.size() || o.v.size() != o.q.size()) return "query, key and value have different ranks";
  const Shape q = as_bhld(o.q), k = as_bhld(o.k), v = as_bhld(o.v);
  for (const Shape* s : {&q, &k, &v})
    for (int64_t d : *s)
      if (d <= 0) return "attention with an empty dimension";
  if (k[3] != q[3]) return "key head dim " + std::to_string(k[3]) + " differs from the query's " + std::to_string(q[3]);
  if (v[2] != k[2]) return "value and key have different sequence lengths";
  if (k[0] != v[0] || k[1] != v[1]) return "key and value have different batch or head counts";
  if (k[0] != q[0] && k[0] != 1) return "key batch " + std::to_string(k[0]) + " does not broadcast to " + std::to_string(q[0]);
  if (q[1] % k[1] != 0) return "query heads " + std::to_string(q[1]) + " are not a multiple of key heads " + std::to_string(k[1]);
  if (!o.gqa && k[1] != q[1] && k[1] != 1) return "key heads differ from query heads without enable_gqa";
  if (q[3] > kAttnMaxHeadDim || v[3] > kAttnMaxHeadDim)
    return "attention head dim over " + std::to_string(kAttnMaxHeadDim) + " is not supported yet";
  if (o.has_mask) {
    if (o.mask.size() > 4) return "attention mask of rank over 4";
    const Shape target = {q[0], q[1], q[2], k[2]};
    const size_t lead = 4 - o.mask.size();
    for (size_t i = 0; i < o.mask.size(); ++i)
      if (o.mask[i] != 1 && o.mask[i] != target[lead + i])
        return "attention mask " + ir::shape_to_string(o.mask) + " does not broadcast to " + ir::shape_to_string(target);
  }
  return "";
}

std::string check(const OpQuery& q) {
  const bool has_mask = !attr_true(q.attrs, "attn_mask_absent") && q.inputs.size() == 4;
  if (q.inputs.size() != (has_mask ? 4u : 3u)) return "attention needs query, key, value and an optional mask";
  if (q.outputs.size() != 1) return "attention with several outputs";
  if (auto it = q.attrs.find("dropout_p"); it != q.attrs.end()) {
    const double* p = std::get_if<double>(&it->second);
    const int64_t* i = std::get_if<int64_t>(&it->second);
    if ((p && *p != 0.0) || (i && *i != 0)) return "attention with dropout (dropout_p != 0) is not supported";
  }
  const engine::DType dt = q.inputs[0].dtype;
  if (q.inputs[1].dtype != dt || q.inputs[2].dtype != dt || q.outputs[0].dtype != dt)
    return "attention with query, key, value and output of different dtypes";
  if (has_mask) {
    const engine::DType m = q.inputs[3].dtype;
    if (m != engine::DType::kBool && m != engine::DType::kFloat32 && m != engine::DType::kFloat16 &&
        m != engine::DType::kBFloat16)
      return "attention mask must be bool or a float tensor";
    if (attr_true(q.attrs, "is_causal")) return "attention with both a mask and is_causal";
  }
  Operands o{q.inputs[0].shape, q.inputs[1].shape, q.inputs[2].shape, has_mask ? q.inputs[3].shape : Shape{}, has_mask,
             attr_true(q.attrs, "enable_gqa")};
  return validate(o);
}

// The operand's logical shape and element strides (attention_layout.cpp may
// have replaced the input by the root it is a view of). A 3-D operand of a
// node with "heads_split" [B, H] is [B * H, a, b], read as [B, H, a, b].
std::pair<Shape, Shape> operand_layout(const ir::Graph& graph, const ir::Node& node, size_t index) {
  const std::string name = kOperands[index];
  const ir::Value& value = graph.value(node.inputs.at(index));
  Shape shape = node.has_attr(name + "_shape") ? node.ints_attr(name + "_shape") : value.shape;
  Shape strides = node.has_attr(name + "_strides") ? node.ints_attr(name + "_strides") : ir::contiguous_strides(shape);
  if (strides.size() != shape.size())
    throw CompileError("node '" + node.name + "': " + name + " strides do not match its rank");
  if (node.has_attr("heads_split") && shape.size() == 3 && name != "mask") {
    const Shape split = node.ints_attr("heads_split");
    if (split.size() != 2 || split[0] * split[1] != shape[0])
      throw CompileError("node '" + node.name + "': heads_split does not divide the " + name + "'s first dim");
    shape = {split[0], split[1], shape[1], shape[2]};
    strides = {strides[0] * split[1], strides[0], strides[1], strides[2]};
  }
  // K given transposed ([.., dim, keys], the second operand of Q @ K^T).
  if (name == "k" && node.int_attr("k_transposed", 0) != 0 && shape.size() >= 2) {
    std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
    std::swap(strides[strides.size() - 1], strides[strides.size() - 2]);
  }
  return {shape, strides};
}

void copy3(std::array<int64_t, 3>& to, const Shape& bhld) { to = {bhld[0], bhld[1], bhld[2]}; }

struct OutputLayout {
  std::array<int64_t, 3> strides{};  // [batch, head, row]
  int64_t row_block = 0, row_block_stride = 0;  // AttentionPlan::out_row_block
};

// A dim of one factor (or none: size 1) has that factor's stride.
std::optional<int64_t> sole_stride(const std::vector<StrideFactor>& dim) {
  if (dim.size() > 1) return std::nullopt;
  return dim.empty() ? 0 : dim[0].stride;
}

// The [batch, head, row] strides of the attention's output inside the
// (contiguous) output of the last node of `chain` (permutes, clones and
// views after it), when the value dim stays contiguous. The row dim may be
// two strided factors (grouped-query rows [group, tokens] going back to
// their heads: AttentionPlan::out_row_block).
std::optional<OutputLayout> output_strides(const ir::Graph& graph, const ir::Node& node,
                                           const std::vector<int>& chain) {
  const ir::Node& last = graph.nodes()[static_cast<size_t>(chain.back())];
  const Shape& last_shape = graph.value(last.outputs[0]).shape;
  // Walk back from the contiguous storage; dims may carry several strided
  // factors on the way (a view merging dims a permute has reordered).
  FactoredDims dims = factored_dims(last_shape, ir::contiguous_strides(last_shape));
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const ir::Node& c = graph.nodes()[static_cast<size_t>(*it)];
    const Shape& in = graph.value(c.inputs[0]).shape;
    if (is_constant_permute_op(c.op)) {
      const Shape perm = permutation_of(c, in.size());
      FactoredDims in_dims(in.size());
      for (size_t j = 0; j < perm.size(); ++j) in_dims[static_cast<size_t>(perm[j])] = dims[j];
      dims = in_dims;
    } else if (is_view_op(c.op)) {
      auto r = view_factored(dims, in);
      if (!r) return std::nullopt;
      dims = *r;
    }  // identity copies: the same layout
  }
  Shape shape = graph.value(node.outputs[0]).shape;
  if (shape.size() == 3 && node.has_attr("heads_split")) {
    const Shape split = node.ints_attr("heads_split");
    auto r = view_factored(dims, {split.at(0), split.at(1), shape[1], shape[2]});
    if (!r) return std::nullopt;
    dims = *r;
    shape = {split.at(0), split.at(1), shape[1], shape[2]};
  }
  OutputLayout out;
  if (const auto st = plain_strides(dims)) {
    if (st->back() != 1 && shape.back() != 1) return std::nullopt;
    const Shape b = strides_bhld(*st);
    out.strides = {b[0], b[1], b[2]};
    return out;
  }
  if (dims.size() != 4 || dims[2].size() != 2) return std::nullopt;
  const auto sb = sole_stride(dims[0]), sh = sole_stride(dims[1]), sd = sole_stride(dims[3]);
  if (!sb || !sh || !sd || (*sd != 1 && shape.back() != 1)) return std::nullopt;
  out.strides = {*sb, *sh, dims[2][1].stride};
  out.row_block = dims[2][1].size;
  out.row_block_stride = dims[2][0].stride;
  return out;
}

std::string label_of(const ir::Node& node) { return node.op == kSdpaOp ? "sdpa" : "attention"; }

void plan_attention_step(PlanContext& ctx, int node_index) {
  const ir::Graph& graph = ctx.graph();
  const ir::Node& node = graph.nodes()[static_cast<size_t>(node_index)];
  AttentionPlan p = plan_attention(graph, node);
  p.tensor_cores = ctx.options().min_target_sm >= 80;
  // Layout copies after the attention (the heads merge: permute [B,H,L,D]
  // -> [B,L,H,D], clones, views between them) are written directly: the
  // output goes to the last copy's storage through strides.
  std::vector<int> chain;
  for (int v = node.outputs[0];;) {
    const int c = ctx.sole_consumer(v);
    if (c < 0) break;
    const ir::Node& next = graph.nodes()[static_cast<size_t>(c)];
    if (!is_constant_permute_op(next.op) && !is_view_op(next.op) && !is_identity_copy(graph, next)) break;
    chain.push_back(c);
    v = graph.nodes()[static_cast<size_t>(c)].outputs[0];
  }
  while (!chain.empty() && is_view_op(graph.nodes()[static_cast<size_t>(chain.back())].op)) chain.pop_back();
  for (; !chain.empty(); chain.pop_back()) {
    if (auto layout = output_strides(graph, node, chain)) {
      p.out = graph.nodes()[static_cast<size_t>(chain.back())].outputs[0];
      p.out_strides = layout->strides;
      p.out_row_block = layout->row_block;
      p.out_row_block_stride = layout->row_block_stride;
      for (int c : chain) ctx.absorb(c);
      break;
    }
  }
  p.splits = attention_decode_splits(p);
  p.prefetch_before_wait = ctx.options().overlap_launches && attention_is_decode(p);
  if (p.splits > 1) {
    p.partials = ctx.graph().add_scratch(graph.value(node.outputs[0]).name + "_partials", engine::DType::kFloat32,
                                         {p.batch, p.heads, p.splits, p.rows, p.value_dim + 2});
    AttentionCombinePlan combine;
    combine.attention = p;
    ctx.emit(PlannedOp(label_of(node), std::move(p)));
    ctx.emit(PlannedOp(label_of(node) + "_combine", std::move(combine)));
    return;
  }
  ctx.emit(PlannedOp(label_of(node), std::move(p)));
}

}  // namespace

bool is_attention_op(const std::string& op) { return op == kSdpaOp || op == kKilnAttentionOp; }

std::string check_attention(const OpQuery& query) { return check(query); }

AttentionPlan plan_attention(const ir::Graph& graph, const ir::Node& node) {
  const bool has_mask = node.inputs.size() == 4;
  auto [qs, qst] = operand_layout(graph, node, 0);
  auto [ks, kst] = operand_layout(graph, node, 1);
  auto [vs, vst] = operand_layout(graph, node, 2);
  Operands o{qs, ks, vs, {}, has_mask, node.int_attr("enable_gqa", 0) != 0};
  Shape mst;
  if (has_mask) std::tie(o.mask, mst) = operand_layout(graph, node, 3);
  if (std::string why = validate(o); !why.empty()) throw CompileError("node '" + node.name + "': " + why);

  AttentionPlan p;
  p.q = node.inputs[0];
  p.k = node.inputs[1];
  p.v = node.inputs[2];
  p.out = node.outputs.at(0);
  p.dtype = graph.value(p.q).dtype;
  const Shape q = as_bhld(qs), k = as_bhld(ks), v = as_bhld(vs);
  const Shape q_st = strides_bhld(qst), k_st = strides_bhld(kst), v_st = strides_bhld(vst);
  for (const auto& [shape, st, what] : {std::tuple{q, q_st, "query"}, {k, k_st, "key"}, {v, v_st, "value"}})
    if (shape[3] != 1 && st[3] != 1)
      throw CompileError(std::string("node '") + node.name + "': the " + what + "'s head dim is not contiguous");
  p.batch = q[0];
  p.heads = q[1];
  p.rows = q[2];
  p.head_dim = q[3];
  // Grouped heads from the layout pass: k and v index kv head h / group.
  const int64_t k_group = node.int_attr("k_group", 1), v_group = node.int_attr("v_group", 1);
  if (k_group != v_group || k[1] % k_group != 0)
    throw CompileError("node '" + node.name + "': key and value share heads differently");
  p.kv_heads = k[1] / k_group;
  p.keys = k[2];
  p.value_dim = v[3];
  copy3(p.q_strides, q_st);
  copy3(p.k_strides, k_st);
  copy3(p.v_strides, v_st);
  if (k[0] == 1) p.k_strides[0] = p.v_strides[0] = 0;  // broadcast over the batch
  Shape out_shape = graph.value(p.out).shape;
  Shape out_st = ir::contiguous_strides(out_shape);
  if (node.has_attr("heads_split") && out_shape.size() == 3) {
    out_shape = {p.batch, p.heads, out_shape[1], out_shape[2]};
    out_st = ir::contiguous_strides(out_shape);
  }
  if (as_bhld(out_shape) != Shape{p.batch, p.heads, p.rows, p.value_dim})
    throw CompileError("node '" + node.name + "': attention output " + ir::shape_to_string(out_shape) +
                       " does not match its operands");
  copy3(p.out_strides, strides_bhld(out_st));
  if (has_mask) {
    p.mask = node.inputs[3];
    p.dtype_mask = graph.value(p.mask).dtype;
    p.mask_kind = p.dtype_mask == engine::DType::kBool ? AttentionPlan::Mask::kBool : AttentionPlan::Mask::kAdditive;
    const size_t lead = 4 - o.mask.size();
    for (size_t i = 0; i < 4; ++i)
      p.mask_strides[i] = i < lead || o.mask[i - lead] == 1 ? 0 : mst[i - lead];
  }
  for (size_t i = 0; i < 4; ++i) p.offsets[i] = node.int_attr(std::string(kOperands[i]) + "_offset", 0);
  p.causal = node.int_attr("is_causal", 0) != 0;
  p.scale = node.has_attr("scale") ? node.float_attr("scale", 1.0) : 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  return p;
}

std::vector<int> AttentionPlan::reads() const {
  std::vector<int> r = {q, k, v};
  if (mask >= 0) r.push_back(mask);
  return r;
}

void AttentionPlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_attention");
  AttentionKernel gen = generate_attention_kernel(*this, k.function);
  ctx.add_source(gen.source);
  for (int d = 0; d < 3; ++d) k.grid[d] = gen.grid[d];
  k.block[0] = gen.block;
  k.args = {ctx.tensor_arg(q), ctx.tensor_arg(this->k), ctx.tensor_arg(v)};
  if (mask >= 0) k.args.push_back(ctx.tensor_arg(mask));
  k.args.push_back(ctx.tensor_arg(splits > 1 ? partials : out));
}

void AttentionCombinePlan::lower(LowerContext& ctx, engine::Step& step) const {
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& k = step.kernel;
  k.function = ctx.kernel_name("kiln_attention_combine");
  AttentionKernel gen = generate_attention_combine_kernel(attention, k.function);
  ctx.add_source(gen.source);
  for (int d = 0; d < 3; ++d) k.grid[d] = gen.grid[d];
  k.block[0] = gen.block;
  k.args = {ctx.tensor_arg(attention.partials), ctx.tensor_arg(attention.out)};
}

KILN_REGISTER_OPS(attention) {
  for (const char* name : {kSdpaOp, kKilnAttentionOp}) {
    OpDef def;
    def.name = name;
    def.role = OpRole::kStep;
    def.check = check;
    def.plan = plan_attention_step;
    def.bool_inputs = true;  // boolean masks
    register_op(std::move(def));
  }
}

}  // namespace kiln::ops
