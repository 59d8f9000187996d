// fold_decode_layers (passes.h): a language model's decode layers, as the plan passes leave them,
// become one persistent-kernel step (ops/decode_layers_ops.h). Each layer must be exactly the six
// steps a Llama-style decode has after plan_gemv_loop_epilogues (five when the attention is not
// split over its keys and writes the heads itself), and everything the kernel assumes
// is checked on the plan and the graph rather than trusted:
//   1 q|k|v GEMV: RMSNorm prologue, one merged [q|k|v] weight; its loop members q's rotary,
//     k's rotary + cache write and v's cache write, at the positions, along the cache's dim 2
//   2 split decode attention: two query rows a kv head, every cache row, scale 1/sqrt(head_dim),
//     an additive mask proven to be 0 for keys <= position and -inf after (so the kernel may
//     read only rows [0, position])
//   3 its combine, writing the heads merged
//   4 o-projection GEMV + the layer's input (residual)
//   5 gate|up GEMV: RMSNorm prologue, SiLU(gate) * up as its pair epilogue
//   6 down GEMV + step 4's output
// Layer i+1 reads layer i's output; nothing outside the layers reads what they compute in
// between. The steps that only fed the folded layers (the mask, the cos/sin gathers) go too.
// When the last layer's output feeds only the head, the head is folded in as well:
//   7 lm_head GEMV: RMSNorm prologue (the final norm), a constant [vocab, hidden] weight
//   8 argmax over its vocab outputs (the token); the logits may still be a program output
// And when the first layer's input is an embedding row that feeds nothing else, the embedding
// (a gather of one row of a constant table at a one-token input) is folded in too.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>

#include "ops/argmax_ops.h"
#include "ops/attention_ops.h"
#include "ops/decode_layers_ops.h"
#include "ops/gather_ops.h"
#include "ops/rotary_ops.h"
#include "ops/state_ops.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

using ops::AttentionCombinePlan;
using ops::AttentionPlan;
using ops::DecodeLayersPlan;
using ops::GemmPlan;
using ops::PlannedOp;

// A failed check: the reason the run is not folded.
struct NotFolded {
  std::string why;
};

class Matcher {
 public:
  Matcher(const ir::Graph& g, const ExecPlan& plan) : g_(g), plan_(plan) {}

  [[noreturn]] void fail(const std::string& why) const { throw NotFolded{why}; }
  void require(bool ok, const std::string& why) const {
    if (!ok) fail(why);
  }
  int root(int v) const { return plan_.storage_of(v); }
  const ir::Value& val(int v) const { return g_.value(v); }
  const ir::Node* producer(int v) const { return val(v).producer >= 0 ? &g_.nodes()[val(v).producer] : nullptr; }

  // The layer of steps [j, j + *steps) reading `x` (six steps, or five when the attention is not
  // split and has no combine); its output in *out.
  DecodeLayersPlan::Layer layer(size_t j, int x, int* out, size_t* steps) {
    require(j + 5 <= plan_.ops.size(), "fewer than five steps left");
    const GemmPlan* g1 = plan_.ops[j].as<GemmPlan>();
    const AttentionPlan* at = plan_.ops[j + 1].as<AttentionPlan>();
    require(g1 && at, "not a decode layer's q|k|v product and attention");
    const bool split = at->splits > 1;
    *steps = split ? 6 : 5;
    require(j + *steps <= plan_.ops.size(), "a decode layer's steps are cut short");
    const AttentionCombinePlan* cb = split ? plan_.ops[j + 2].as<AttentionCombinePlan>() : nullptr;
    const size_t k = split ? j + 3 : j + 2;
    const GemmPlan* g2 = plan_.ops[k].as<GemmPlan>();
    const GemmPlan* g3 = plan_.ops[k + 1].as<GemmPlan>();
    const GemmPlan* g4 = plan_.ops[k + 2].as<GemmPlan>();
    require((cb || !split) && g2 && g3 && g4, "not the steps of a decode layer");
    const int64_t H = shape_.hidden, hd = 64;
    DecodeLayersPlan::Layer L;
    // 1: q|k|v
    plain_gemv(*g1, "q|k|v");
    require(g1->rms_norm && g1->norm_weight >= 0 && root(g1->a) == root(x), "q|k|v does not normalize the layer's input");
    require(g1->loop_members.size() == 3, "q|k|v does not run the rotary and cache writes");
    require(g1->k == H, "q|k|v's inputs are not the hidden size");
    norm(g1->norm_weight, g1->norm_eps, &L.norm1);
    L.qkv = g1->b;
    const ops::RotaryPlan* rq = g1->loop_members[0].as<ops::RotaryPlan>();
    const ops::StateScatterPlan* wk = g1->loop_members[1].as<ops::StateScatterPlan>();
    const ops::StateScatterPlan* wv = g1->loop_members[2].as<ops::StateScatterPlan>();
    require(rq && wk && wv, "q|k|v's members are not q's rotary and the k and v cache writes");
    L.q_col = heads_map(rq->x_storage, rq->x_map, g1->out, "q");
    require(same_rotary(rq->cos, rq->sin), "q's rotary reads another cos/sin");
    L.k_col = cache_write(*wk, g1->out, true, &L.k_cache, &L.k_written);
    L.v_col = cache_write(*wv, g1->out, false, &L.v_cache, &L.v_written);
    require(g1->n == (shape_.heads + 2 * shape_.kv_heads) * hd, "q|k|v has other columns than q, k and v");
    // 2, 3: attention over the cache and its combine
    require(at->batch == 1 && at->heads == shape_.kv_heads && at->kv_heads == shape_.kv_heads &&
                at->rows == shape_.heads / shape_.kv_heads && at->head_dim == hd && at->value_dim == hd,
            "the attention is not two query rows a kv head of head_dim 64");
    require(at->keys == shape_.max_len && !at->causal, "the attention does not read every cache row");
    require(std::fabs(at->scale - 0.125) < 1e-9, "the attention's scale is not 1/sqrt(64)");
    require(root(at->q) == root(rq->out) && at->offsets[0] == 0 && at->q_strides[1] == 2 * hd && at->q_strides[2] == hd,
            "the attention's queries are not the rotated q, two heads a kv head");
    const int64_t head_stride = shape_.max_len * hd;
    require(root(at->k) == root(L.k_cache) && root(at->v) == root(L.v_cache) && at->offsets[1] == 0 &&
                at->offsets[2] == 0 && at->k_strides[1] == head_stride && at->k_strides[2] == hd &&
                at->v_strides[1] == head_stride && at->v_strides[2] == hd,
            "the attention does not read this layer's caches");
    causal_mask(*at);
    if (split) require(root(cb->attention.partials) == root(at->partials), "the combine is not the attention's");
    const AttentionPlan& c = split ? cb->attention : *at;  // what writes the heads' outputs
    for (int64_t gh = 0; gh < shape_.kv_heads; ++gh)
      for (int64_t r = 0; r < 2; ++r) {
        const int64_t at_off = c.out_row_block > 0
                                   ? gh * c.out_strides[1] + (r / c.out_row_block) * c.out_row_block_stride +
                                         (r % c.out_row_block) * c.out_strides[2]
                                   : gh * c.out_strides[1] + r * c.out_strides[2];
        require(at_off == (2 * gh + r) * hd, "the attention's heads are not merged in order");
      }
    // 4: o-projection + residual
    plain_gemv(*g2, "the o-projection");
    require(!g2->rms_norm && root(g2->a) == root(c.out) && g2->c >= 0 && root(g2->c) == root(x) && g2->beta == 1.0f &&
                g2->n == H && g2->k == shape_.heads * hd,
            "the o-projection does not add the layer's input");
    L.o = g2->b;
    // 5: gate|up with SiLU(gate) * up
    plain_gemv(*g3, "gate|up", true);
    require(g3->rms_norm && g3->norm_weight >= 0 && root(g3->a) == root(g2->out) && g3->paired && g3->k == H,
            "gate|up does not normalize the attention's sum");
    norm(g3->norm_weight, g3->norm_eps, &L.norm2);
    require(g3->n % 2 == 0 && (shape_.intermediate == 0 || g3->n == 2 * shape_.intermediate), "gate|up's width changes");
    shape_.intermediate = g3->n / 2;
    L.gate_up = g3->b;
    L.gate_first = silu_times(*g3);
    // 6: down + residual
    plain_gemv(*g4, "down");
    require(!g4->rms_norm && root(g4->a) == root(g3->out) && g4->c >= 0 && root(g4->c) == root(g2->out) &&
                g4->beta == 1.0f && g4->n == H && g4->k == shape_.intermediate,
            "the down projection does not add the attention's sum");
    L.down = g4->b;
    *out = g4->out;
    internal_.insert({root(g1->out), root(rq->out), root(c.out), root(g2->out), root(g3->out)});
    if (split) internal_.insert(root(at->partials));
    return L;
  }

  // The head at steps [j, j + 2) reading the last layer's output `x`: the lm_head GEMV with the
  // final RMSNorm, then the argmax of its row. Fills the plan's head fields.
  void head(size_t j, int x, DecodeLayersPlan* dl) {
    require(j + 2 <= plan_.ops.size(), "no lm_head and argmax after the layers");
    const GemmPlan* lm = plan_.ops[j].as<GemmPlan>();
    const ops::ArgmaxPlan* am = plan_.ops[j + 1].as<ops::ArgmaxPlan>();
    require(lm && am, "the layers are not followed by an lm_head product and its argmax");
    plain_gemv(*lm, "the lm_head");
    require(lm->rms_norm && lm->norm_weight >= 0 && root(lm->a) == root(x) && lm->c < 0 && lm->loop_members.empty() &&
                lm->k == shape_.hidden,
            "the lm_head does not normalize the last layer's output alone");
    require(val(lm->norm_weight).is_constant && val(lm->norm_weight).dtype == shape_.dtype &&
                val(lm->norm_weight).numel() == shape_.hidden,
            "the final RMSNorm's weight is not a constant of the model's dtype");
    require(val(lm->b).shape == std::vector<int64_t>{lm->n, shape_.hidden}, "the lm_head's weight is not [vocab, hidden]");
    require(root(am->input) == root(lm->out) && am->reduced == lm->n && am->outer == 1 && am->inner == 1 &&
                val(am->out).dtype == engine::DType::kInt64,
            "the argmax is not over the lm_head's whole row");
    dl->shape.vocab = lm->n;
    dl->shape.head_eps = lm->norm_eps;
    dl->head_w = lm->b;
    dl->head_norm = lm->norm_weight;
    dl->logits = lm->out;
    dl->token = am->out;
  }

  ops::DecodeLayersShape shape_;
  int cos_ = -1, sin_ = -1, positions_ = -1, mask_ = -1;
  double eps_ = -1;
  std::set<int> internal_;  // storages only the folded steps may read

 private:
  void plain_gemv(const GemmPlan& p, const char* what, bool paired = false) const {
    require(p.gemv && p.m == 1 && p.batch == 1 && p.b_transposed && p.bias < 0 && p.alpha == 1.0f &&
                p.epilogue == engine::GemmEpilogue::kNone && p.paired == paired && val(p.b).is_constant &&
                val(p.b).dtype == shape_.dtype,
            std::string(what) + " is not a one-row product with a constant weight of the model's dtype");
  }
  void norm(int weight, double eps, int* out) {
    require(val(weight).is_constant && val(weight).dtype == shape_.dtype && val(weight).numel() == shape_.hidden,
            "an RMSNorm weight is not a constant of the model's dtype");
    require(eps_ < 0 || eps == eps_, "the RMSNorms' eps differ");
    eps_ = eps;
    *out = weight;
  }
  bool same_rotary(int cos, int sin) {
    if (cos_ < 0) {
      cos_ = cos;
      sin_ = sin;
    }
    return root(cos) == root(cos_) && root(sin) == root(sin_);
  }
  // q, k or v, head by head, read from the merged product `storage` through `map` over
  // [1, heads, 1, 64]: column base + h * 64 + d. Returns base.
  int64_t heads_map(int storage, const codegen::AffineMap& map, int product, const char* what) const {
    require(storage >= 0 && root(storage) == root(product) && map.coef.size() == 4 && map.coef[1] == 64 &&
                map.coef[3] == 1 && map.base >= 0 && map.base % 64 == 0,
            std::string(what) + " is not read from the q|k|v product head by head");
    return map.base;
  }
  int64_t cache_write(const ops::StateScatterPlan& w, int product, bool rotary, int* cache, int* written) {
    require(w.dim == 2 && val(w.state).is_state && val(w.state).shape == std::vector<int64_t>{1, shape_.kv_heads, shape_.max_len, 64} &&
                val(w.state).dtype == shape_.dtype,
            "a cache write is not into a [1, kv_heads, max_len, 64] cache along its positions");
    require(positions_ < 0 || root(w.index) == root(positions_), "the cache writes use other positions");
    positions_ = w.index;
    require(rotary == (w.rotary_cos >= 0), "k's cache write does not rotate, or v's does");
    if (rotary) require(same_rotary(w.rotary_cos, w.rotary_sin), "k's rotary reads another cos/sin");
    *cache = w.state;
    *written = w.out;
    return heads_map(w.values_storage, w.values_map, product, "k or v");
  }
  // The gate|up epilogue: SiLU of one half times the other, as HF's bf16 MLP writes it
  // (x.float(), sigmoid, multiply, back to the dtype, times up). Returns whether the gate is the
  // first half.
  bool silu_times(const GemmPlan& p) const {
    require(p.pair_nodes.size() >= 3, "gate|up's epilogue is not SiLU(gate) * up");
    const ir::Node& last = g_.nodes()[p.pair_nodes.back()];
    require(last.op == "aten.mul.Tensor" && last.outputs.size() == 1 && root(last.outputs[0]) == root(p.out),
            "gate|up's epilogue does not end in the product");
    const int a = last.inputs[0], b = last.inputs[1];
    const bool a_up = root(a) == root(p.pair_first) || root(a) == root(p.pair_second);
    const int up = a_up ? a : b, silu = a_up ? b : a;
    require(root(up) == root(p.pair_first) || root(up) == root(p.pair_second), "gate|up's epilogue does not multiply by up");
    // silu: [to_copy] (mul (x, sigmoid(x))) [to_copy]; x = [to_copy] gate
    const ir::Node* n = producer(silu);
    auto skip_copy = [&](const ir::Node* node) {
      while (node && node->op == "aten._to_copy.default") node = producer(node->inputs[0]);
      return node;
    };
    n = skip_copy(n);
    require(n && n->op == "aten.mul.Tensor", "gate|up's epilogue is not SiLU(gate) * up");
    const ir::Node* sg = producer(n->inputs[1]);
    int x = n->inputs[0];
    if (!sg || sg->op != "aten.sigmoid.default") {
      sg = producer(n->inputs[0]);
      x = n->inputs[1];
    }
    require(sg && sg->op == "aten.sigmoid.default" && root(sg->inputs[0]) == root(x), "gate|up's epilogue is not SiLU(gate) * up");
    int gate = x;
    for (const ir::Node* c = producer(gate); c && c->op == "aten._to_copy.default"; c = producer(gate)) gate = c->inputs[0];
    require((root(gate) == root(p.pair_first) || root(gate) == root(p.pair_second)) && root(gate) != root(up),
            "gate|up's epilogue is not SiLU(gate) * up");
    for (int node : p.pair_nodes) {
      const std::string& op = g_.nodes()[node].op;
      require(op == "aten.mul.Tensor" || op == "aten.sigmoid.default" || op == "aten._to_copy.default",
              "gate|up's epilogue computes more than SiLU(gate) * up");
    }
    return root(gate) == root(p.pair_first);
  }
  // The mask is where(key_positions <= positions.repeat(rows), 0, -inf) over a constant
  // key_positions = arange(max_len): 0 for keys [0, position], -inf after.
  void causal_mask(const AttentionPlan& at) {
    require(at.mask >= 0 && at.mask_kind == AttentionPlan::Mask::kAdditive && at.mask_strides[3] == 1 &&
                at.offsets[3] == 0,
            "the attention has no additive mask over the keys");
    require(mask_ < 0 || root(at.mask) == root(mask_), "the layers' masks differ");
    if (mask_ >= 0) return;
    mask_ = at.mask;
    const ir::Node* cast = producer(at.mask);
    const ir::Node* where = cast && cast->op == "aten._to_copy.default" ? producer(cast->inputs[0]) : cast;
    require(where && where->op == "aten.where.self" && where->inputs.size() == 3, "the mask is not a where()");
    require(scalar_is(where->inputs[1], 0.0) && scalar_is(where->inputs[2], -INFINITY), "the mask is not 0 / -inf");
    const ir::Node* le = producer(where->inputs[0]);
    require(le && le->op == "aten.le.Tensor", "the mask does not compare key <= position");
    require(is_arange(le->inputs[0]), "the mask's keys are not arange(max_len)");
    const ir::Node* n = producer(le->inputs[1]);
    while (n && (n->op == "aten.unsqueeze_copy.default" || n->op == "aten.view_copy.default")) n = producer(n->inputs[0]);
    require(n && n->op == "aten.repeat.default" && positions_ >= 0 && root(n->inputs[0]) == root(positions_),
            "the mask does not compare with the positions");
  }
  bool scalar_is(int v, double want) const {
    const ir::Value& c = val(v);
    if (!c.is_constant || c.numel() != 1 || c.dtype != engine::DType::kFloat32 || c.data.size() < 4) return false;
    float f;
    std::memcpy(&f, c.data.data(), 4);
    return std::isinf(want) ? (std::isinf(f) && (f < 0) == (want < 0)) : f == want;
  }
  bool is_arange(int v) const {
    const ir::Value& c = val(v);
    if (!c.is_constant || c.numel() != shape_.max_len || c.shape.back() != shape_.max_len) return false;
    for (int64_t i = 0; i < shape_.max_len; ++i) {
      int64_t x = 0;
      if (c.dtype == engine::DType::kInt64)
        std::memcpy(&x, c.data.data() + 8 * i, 8);
      else if (c.dtype == engine::DType::kInt32) {
        int32_t y;
        std::memcpy(&y, c.data.data() + 4 * i, 4);
        x = y;
      } else {
        return false;
      }
      if (x != i) return false;
    }
    return true;
  }

  const ir::Graph& g_;
  const ExecPlan& plan_;
};

// The gathers of one row of a constant [max_len, 64] table at the positions: the table.
int gathered_table(const ir::Graph& g, const ExecPlan& plan, int row, int positions, int64_t max_len) {
  for (const PlannedOp& op : plan.ops) {
    const ops::GatherPlan* gp = op.as<ops::GatherPlan>();
    if (!gp || plan.storage_of(gp->out) != plan.storage_of(row)) continue;
    const ir::Value& t = g.value(gp->data);
    if (t.is_constant && t.shape == std::vector<int64_t>{max_len, 64} && gp->indices.size() == 1 &&
        plan.storage_of(gp->indices[0].value) == plan.storage_of(positions) && g.value(row).numel() == 64)
      return gp->data;
  }
  return -1;
}

}  // namespace

int fold_decode_layers(const ir::Graph& graph, ExecPlan& plan, const ops::OpOptions& options, std::string* why_not) {
  auto not_folded = [&](const std::string& why) {
    if (why_not) *why_not = why;
    return 0;
  };
  if (!options.persistent_decode) return not_folded("");
  if (options.min_target_sm < 90)
    return not_folded("the persistent decode kernel needs every target SM to be sm_90 or newer (the oldest is sm_" +
                      std::to_string(options.min_target_sm) + ")");
  // The first step that can start a layer: a q|k|v GEMV with loop members.
  size_t start = 0;
  while (start < plan.ops.size()) {
    const GemmPlan* g = plan.ops[start].as<GemmPlan>();
    if (g && g->gemv && !g->loop_members.empty()) break;
    ++start;
  }
  if (start == plan.ops.size())
    return not_folded("nothing to fold here: no one-token decode layer (no q|k|v matrix-vector product carrying "
                      "its layer's rotary and cache writes: a prefill method has none, nor a layer of another form, "
                      "e.g. with per-head q/k norms)");
  Matcher m(graph, plan);
  const GemmPlan& first = *plan.ops[start].as<GemmPlan>();
  const ir::Value& x0 = graph.value(first.a);
  m.shape_.hidden = x0.shape.empty() ? 0 : x0.shape.back();
  m.shape_.dtype = x0.dtype;
  m.shape_.head_dim = 64;
  std::vector<DecodeLayersPlan::Layer> layers;
  int x = first.a;
  std::string stopped;
  try {
    const ops::StateScatterPlan* wk = first.loop_members.size() == 3 ? first.loop_members[1].as<ops::StateScatterPlan>() : nullptr;
    m.require(wk != nullptr && graph.value(wk->state).shape.size() == 4, "the first q|k|v does not write a cache");
    m.shape_.kv_heads = graph.value(wk->state).shape[1];
    m.shape_.max_len = graph.value(wk->state).shape[2];
    m.shape_.heads = (first.n / 64) - 2 * m.shape_.kv_heads;
    const std::string unsupported = ops::decode_layers_unsupported([&] {
      ops::DecodeLayersShape s = m.shape_;
      s.intermediate = 8, s.layers = 1;
      return s;
    }());
    m.require(unsupported.empty(), unsupported);
  } catch (const NotFolded& e) {
    return not_folded(e.why);
  }
  size_t j = start;
  std::vector<size_t> layer_end;  // each layer's last step + 1
  while (true) {
    try {
      int next = -1;
      size_t steps = 0;
      DecodeLayersPlan::Layer L = m.layer(j, x, &next, &steps);
      layers.push_back(L);
      x = next;
      j += steps;
      layer_end.push_back(j);
    } catch (const NotFolded& e) {
      stopped = e.why;
      break;
    }
  }
  if (layers.empty()) return not_folded(stopped);
  size_t end = j;  // the folded steps are [start, end)
  DecodeLayersPlan dl;
  dl.kernel = options.decode_layers;
  dl.shape = m.shape_;
  dl.shape.layers = static_cast<int64_t>(layers.size());
  dl.shape.eps = first.norm_eps;
  dl.x = first.a;
  dl.out = x;
  dl.positions = m.positions_;
  dl.layers = layers;
  // What is kept depends on the graph's outputs and states only (not on the steps): once.
  const std::vector<bool> kept = kept_storage(graph, plan);
  auto is_kept = [&](int storage) { return storage < static_cast<int>(kept.size()) && kept[storage]; };
  auto read_only_within = [&](int storage, size_t first, size_t last) {  // by steps [first, last) alone
    for (size_t i = 0; i < plan.ops.size(); ++i)
      if (i < first || i >= last)
        for (int r : plan.ops[i].reads())
          if (plan.storage_of(r) == storage) return false;
    return true;
  };
  // The head too, when the last layer's output feeds nothing else and the shapes fit.
  try {
    DecodeLayersPlan with_head = dl;
    m.head(end, x, &with_head);
    const int last = plan.storage_of(x);
    m.require(!is_kept(last), "the last layer's output is kept");
    m.require(read_only_within(last, start, end + 1), "the last layer's output is read by more than the lm_head");
    m.require(read_only_within(plan.storage_of(with_head.logits), end + 1, end + 2),
              "the logits are read by more than the argmax");
    const std::string unsupported = ops::decode_layers_unsupported(with_head.shape);
    m.require(unsupported.empty(), unsupported);
    dl = with_head;
    end += 2;
    m.internal_.insert(last);
  } catch (const NotFolded&) {
    // The layers alone: the head stays two steps of its own.
  }
  // The embedding too.
  size_t embed_at = plan.ops.size();
  try {
    const int x0 = plan.storage_of(dl.x);
    for (size_t i = 0; i < start; ++i)
      if (plan.storage_of(plan.ops[i].writes()) == x0) embed_at = i;
    m.require(embed_at < start, "the first layer's input is not made by a step before the layers");
    const ops::GatherPlan* gp = plan.ops[embed_at].as<ops::GatherPlan>();
    m.require(gp != nullptr, "the first layer's input is not a gather");
    const ir::Value& table = graph.value(gp->data);
    m.require(table.is_constant && table.dtype == dl.shape.dtype && table.shape.size() == 2 &&
                  table.shape[1] == dl.shape.hidden && graph.value(gp->out).numel() == dl.shape.hidden,
              "the first layer's input is not a row of a constant [rows, hidden] table");
    m.require(gp->indices.size() == 1 && gp->source.size() == 2 && gp->source[0] == -1 && gp->source[1] >= 0 &&
                  gp->indices[0].map.base == 0,
              "the embedding is not one row picked by one index");
    const int token = gp->indices[0].value;
    const ir::Value& tv = graph.value(token);
    m.require(tv.dtype == engine::DType::kInt64 && tv.numel() == 1 &&
                  std::find(graph.inputs().begin(), graph.inputs().end(), token) != graph.inputs().end(),
              "the embedding's index is not an int64 input of one element");
    m.require(!is_kept(x0), "the embedding row is kept");
    m.require(read_only_within(x0, start, end), "the embedding row is read by more than the layers");
    dl.shape.embed_rows = table.shape[0];
    dl.x = gp->data;
    dl.token_in = token;
  } catch (const NotFolded&) {
    embed_at = plan.ops.size();  // the embedding stays a step of its own
  }
  try {
    const std::string unsupported = ops::decode_layers_unsupported(dl.shape);
    m.require(unsupported.empty(), unsupported);
    m.require(ops::decode_layers_fewest_blocks(dl.shape, dl.kernel) > 0, "no grid of at most 32 clusters splits its MLP");
    const ir::Value& pos = graph.value(dl.positions);
    m.require(pos.dtype == engine::DType::kInt64 && pos.numel() == 1 &&
                  std::find(graph.inputs().begin(), graph.inputs().end(), dl.positions) != graph.inputs().end(),
              "the positions are not an int64 input of one element");
    dl.cos_table = gathered_table(graph, plan, m.cos_, dl.positions, dl.shape.max_len);
    dl.sin_table = gathered_table(graph, plan, m.sin_, dl.positions, dl.shape.max_len);
    m.require(dl.cos_table >= 0 && dl.sin_table >= 0 && graph.value(dl.cos_table).dtype == dl.shape.dtype &&
                  graph.value(dl.sin_table).dtype == dl.shape.dtype,
              "cos and sin are not rows of constant [max_len, 64] tables of the model's dtype at the positions");
    // What the layers compute in between is theirs alone.
    for (size_t l = 0; l + 1 < layers.size(); ++l) m.internal_.insert(plan.storage_of(plan.ops[layer_end[l] - 1].writes()));
    for (int s : m.internal_) m.require(!is_kept(s), "a layer's intermediate is kept");
    for (size_t i = 0; i < plan.ops.size(); ++i) {
      if (i >= start && i < end) continue;
      for (int r : plan.ops[i].reads())
        m.require(!m.internal_.count(plan.storage_of(r)),
                  "step " + std::to_string(i) + " ('" + plan.ops[i].label + "') reads inside the layers");
    }
    for (const ir::State& st : graph.states())
      if (st.value == layers[0].k_cache) dl.sync_key = st.key + "/decode_layers_sync";
    m.require(!dl.sync_key.empty(), "the first cache is not a state");
  } catch (const NotFolded& e) {
    return not_folded(e.why);
  }
  size_t folded = end - start;
  plan.ops.erase(plan.ops.begin() + static_cast<std::ptrdiff_t>(start), plan.ops.begin() + static_cast<std::ptrdiff_t>(end));
  plan.ops.insert(plan.ops.begin() + static_cast<std::ptrdiff_t>(start), PlannedOp("decode_layers", std::move(dl)));
  if (embed_at < start) {
    plan.ops.erase(plan.ops.begin() + static_cast<std::ptrdiff_t>(embed_at));
    ++folded;
  }
  // Steps whose results nobody reads any more (the mask, the cos/sin gathers) go.
  size_t dropped = 0;
  for (bool changed = true; changed;) {
    changed = false;
    std::set<int> read;
    for (const PlannedOp& op : plan.ops)
      for (int r : op.reads()) read.insert(plan.storage_of(r));
    for (size_t i = plan.ops.size(); i-- > 0;) {
      bool live = false;
      for (int w : plan.ops[i].all_writes()) {
        const int s = plan.storage_of(w);
        live |= read.count(s) > 0 || is_kept(s) || graph.value(w).is_state;
      }
      if (live) continue;
      plan.ops.erase(plan.ops.begin() + static_cast<std::ptrdiff_t>(i));
      ++dropped;
      changed = true;
      break;
    }
  }
  if (why_not) why_not->clear();
  return static_cast<int>(folded + dropped - 1);
}

}  // namespace kiln::passes
