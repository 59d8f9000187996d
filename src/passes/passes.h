// The compiler's passes, in the order compiler.cpp runs them. Each rewrites
// the graph (or derives a plan from it) and throws CompileError naming the
// node it cannot handle.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op_options.h"
#include "passes/exec_plan.h"

namespace kiln::passes {

// Evaluates permutes/transposes and views of constants at export time; the
// folded node's output becomes a constant and the node is marked "kiln.folded".
void fold_constants(ir::Graph& graph);
// Whether fold_constants makes a node of `op` a constant whenever its input
// is one: views and permutes (the element bytes are the input's, reordered).
bool folds_view_of_constant(const std::string& op);

// Nodes with the same op, attributes and (already merged) inputs as an
// earlier node are computed once (common_subexpressions.cpp).
ir::Graph merge_common_subexpressions(const ir::Graph& graph);

// Folds inference batch norm into the convolution before it where that conv
// has constant weights and no other use; any other batch norm becomes a
// per-channel multiply-add. Runs before precision, so folding is exact.
ir::Graph fold_batch_norm(const ir::Graph& graph);

// 2-D convolutions whose kernel equals their stride (patch embeddings: ViT's
// 16x16/16, ConvNeXt's stem) become a gather of the patches and one GEMM
// instead of cuDNN's strided convolution (vit_b_16's patch embedding took
// 60-90 us there on an H200), when options.conv_gemm is "all"
// (patchify_conv.cpp). Runs after fold_batch_norm (it keeps the folded bias)
// and before channels_last (which then cancels its layout permutes inside
// conv stacks).
ir::Graph patchify_convolutions(const ir::Graph& graph, const ops::OpOptions& options = {});

// Rewrites 2-D convolutions and pooling into channels-last (NHWC) forms and
// carries the NHWC layout through layout-agnostic ops so that layout kernels
// remain only where a consumer needs NCHW (see channels_last.cpp).
ir::Graph to_channels_last(const ir::Graph& graph);

// The dtype the engine computes in: float16/bfloat16 when enabled (float16
// first), else float32.
engine::DType choose_compute_dtype(const std::vector<engine::DType>& enabled_precisions);

// Returns a graph whose internal float32 values (and constants) are in
// `compute`, with casts inserted where graph inputs feed matrix products and
// where graph outputs need their original dtype back. Unchanged when
// `compute` is float32.
ir::Graph apply_precision(const ir::Graph& graph, engine::DType compute);

// Attention operands (q, k, v, mask) reached through views, permutes and
// expands are read from their root value with strides (the node gets
// "<operand>_shape"/"<operand>_strides" attributes) and the copies nobody
// else reads are dropped (attention_layout.cpp). Runs just before fuse().
void attention_operand_layouts(ir::Graph& graph);

// Each piece of a split (split_with_sizes_copy, split_copy: a fused q|k|v or gate|up
// projection's chunks) becomes a slice node of the split's input, so its readers read it in place
// as they read any slice, not through a layout kernel a piece (split_to_slices.cpp). Splits of
// constants are left to fold_constants.
ir::Graph splits_to_slices(const ir::Graph& graph);

// Linears reading the same input with constant weights of one width, whose
// results only feed attention operands (query/key/value projections),
// become one GEMM over the stacked weights; each result is a slice of it
// (merge_linears.cpp). Runs after fuse_attention.
ir::Graph merge_sibling_linears(const ir::Graph& graph);

// Moves permutes that keep the last dim across linears (a linear maps rows
// on their own) to the side where they cost no more or where the attention
// step reads or writes through strides (linear_permutes.cpp). Runs after
// fuse_attention, before attention_operand_layouts.
ir::Graph commute_linear_permutes(const ir::Graph& graph);

// Recognizes attention written as bmm -> scale -> mask -> softmax -> bmm
// (how torch.export decomposes scaled_dot_product_attention, and how many
// models write it) and makes each one kiln.attention node
// (fuse_attention.cpp). Returns how many it fused.
int fuse_attention(ir::Graph& graph);

// Rotary position embedding in rotate_half form (x * cos + cat(-x2, x1) *
// sin) becomes one kiln.rotary node (fuse_rotary.cpp). Returns how many.
int fuse_rotary(ir::Graph& graph);

// Groups the nodes into launches: matrix products (with bias/relu epilogues
// folded in) and fused elementwise kernels. Adds transposed weight constants
// to `graph` where that avoids a transpose at run time.
ExecPlan fuse(ir::Graph& graph, const ops::OpOptions& options = {});

// After fuse() when OpOptions::depthwise_kernels: depthwise conv steps
// (groups == c == k, no residual) become generated kernels, taking over the
// elementwise kernel that is the conv value's only reader as their epilogue.
// Adds [r,s,c] weight constants (depthwise_kernels.cpp).
void plan_depthwise_kernels(ir::Graph& graph, ExecPlan& plan);

// After fuse(): a matrix-vector kernel (GemmPlan::gemv) whose product only
// one elementwise kernel reads, as its two last-dim halves (a merged gate|up
// read by SiLU(gate) * up), takes that kernel's arithmetic as its epilogue
// (GemmPlan::paired; gemv_pair_epilogue.cpp).
void plan_gemv_pair_epilogues(const ir::Graph& graph, ExecPlan& plan);

// After fuse(): a column reduction (reduced dims adjacent, >= 16 elements
// inside them) that would launch too few blocks is split into partial
// reductions over equal chunks (a float32 temporary) and a reduction of the
// chunks (split_reduce.cpp). Adds a view and the temporary to `graph`.
void split_reductions(ir::Graph& graph, ExecPlan& plan);

// After the other plan passes: adjacent steps whose kernels are grid-stride
// loops (ops/grid_loop.h) and that are independent of each other become one
// ops::LaunchGroupPlan, one launch (group_launches.cpp). Returns the launches
// saved.
int group_launches(ExecPlan& plan);

// After group_launches: a one-row matrix-vector kernel whose product only
// the next step reads, grid loops each iteration of which reads one column
// (a rotary, a KV-cache update), runs them in its epilogue
// (GemmPlan::loop_members; gemv_loop_epilogue.cpp). Returns the steps removed.
int plan_gemv_loop_epilogues(const ir::Graph& graph, ExecPlan& plan);

// After plan_gemv_loop_epilogues, when OpOptions::persistent_decode: the run of a language
// model's decode layers (six steps a layer: q|k|v with its rotary and cache writes, split
// attention, combine, o-projection + residual, gate|up with SiLU * up, down + residual; every
// assumption checked, the mask proven causal by position) becomes one ops::DecodeLayersPlan, and
// the steps that only fed it go (fold_decode_layers.cpp). Returns the steps removed; when nothing
// was folded, *why_not (if given) says why ("" when the option is off).
int fold_decode_layers(const ir::Graph& graph, ExecPlan& plan, const ops::OpOptions& options,
                       std::string* why_not = nullptr);

// Lifetime-based placement of activations in one arena.
struct ArenaRequest {
  uint64_t nbytes = 0;
  int first_op = 0;  // op that writes it
  int last_op = 0;   // last op that reads it (>= first_op)
};
struct ArenaPlan {
  std::vector<uint64_t> offsets;  // per request, kAlignment aligned
  uint64_t arena_bytes = 0;
};
constexpr uint64_t kArenaAlignment = 256;
ArenaPlan plan_arena(const std::vector<ArenaRequest>& requests);

}  // namespace kiln::passes
