// A language model's decode layers as one persistent-kernel step (ops/decode_layers_kernel.h):
// what passes/fold_decode_layers.cpp found in the plan, and its lowering: the kernel in a module
// of its own (sm_90+ only, never launched programmatically), a persistent kernel step (the runtime
// launches as many clusters as are co-resident), a derived weight (the layers' weights repacked at
// load into the kernel's stages, beside the originals, which other methods still read) and a state
// of the step's own (its sync area).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/decode_layers_kernel.h"
#include "ops/step_plan.h"

namespace kiln::ops {

struct DecodeLayersPlan : StepPlanBase<DecodeLayersPlan> {
  struct Layer {
    int norm1 = -1, norm2 = -1;  // RMSNorm weights [hidden]
    int qkv = -1;                // the merged q|k|v weight [n, hidden], nn.Linear layout
    int64_t q_col = 0, k_col = 0, v_col = 0;  // where q, k and v start among its rows
    int o = -1;                  // [hidden, heads * head_dim]
    int gate_up = -1;            // the merged gate|up weight [2 * intermediate, hidden]
    bool gate_first = true;      // its first half is the gate (SiLU's input)
    int down = -1;               // [hidden, intermediate]
    int k_cache = -1, v_cache = -1;          // the caches' states [1, kv_heads, max_len, head_dim]
    int k_written = -1, v_written = -1;      // the values the cache updates wrote (aliases of the states)
  };
  DecodeLayersShape shape;
  DecodeLayersKernelOptions kernel;
  int x = -1;          // the first layer's input row [1, 1, hidden]
  int out = -1;        // the last layer's output row
  int positions = -1;  // int64 [1]
  int cos_table = -1, sin_table = -1;  // [max_len, head_dim]
  std::vector<Layer> layers;
  // The key of the step's sync area (a state of its own), unique in the program.
  std::string sync_key;
  // With the head folded in (shape.vocab > 0): the final RMSNorm's weight, the lm_head's weight
  // [vocab, hidden], the logits row it writes and the argmax's token (the step's output).
  int head_norm = -1, head_w = -1, logits = -1, token = -1;
  // With the embedding folded in (shape.embed_rows > 0): `x` is the embedding table and this the
  // token input (int64 [1]) that picks its row.
  int token_in = -1;

  std::vector<int> reads() const override;
  int writes() const override { return shape.vocab > 0 ? token : out; }
  // The kernel writes no cache row for a position outside [0, max_len) and returns NaN: negative
  // positions, which the cache update it replaces would wrap, are refused instead.
  std::vector<ValueRange> index_ranges() const override;
  std::vector<int> also_writes() const override;
  void lower(LowerContext& ctx, engine::Step& step) const override;
};

// The copies that make the packed weights (decode_layers_packed_elems(shape) elements) from the
// layers' weight tensors: `tensor(value)` names each weight's engine tensor. Per layer the stages
// of decode_layers_kernel.h's layout, then every layer's two norm weights.
std::vector<engine::DerivedCopy> decode_layers_pack_copies(const DecodeLayersPlan& plan,
                                                           const std::vector<uint32_t>& layer_tensors);

}  // namespace kiln::ops
