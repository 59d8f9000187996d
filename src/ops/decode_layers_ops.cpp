// The decode-layers step's lowering (decode_layers_ops.h).
#include "ops/decode_layers_ops.h"


#include "ir/graph.h"

namespace kiln::ops {
namespace {

constexpr uint64_t kStageBytes = kDecodeLayersStageBytes;
constexpr int64_t kCluster = kDecodeLayersCluster;

// Head dim of a phase-A block's w-th q|k|v row: 4 dims and their rotary partners half a head away
// (the kernel's head_dim_of).
int64_t head_dim_of(int64_t rank, int64_t w, int64_t head_dim) {
  return w < 4 ? 4 * rank + w : 4 * rank + head_dim / 2 - 4 + w;
}

}  // namespace

std::vector<ValueRange> DecodeLayersPlan::index_ranges() const {
  std::vector<ValueRange> ranges = {{positions, 0, shape.max_len,
                                     "the persistent decode kernel's cache positions (max_len " +
                                         std::to_string(shape.max_len) + ")"}};
  if (shape.embed_rows > 0)
    ranges.push_back({token_in, 0, shape.embed_rows,
                      "the persistent decode kernel's embedding rows (" + std::to_string(shape.embed_rows) + ")"});
  return ranges;
}

std::vector<int> DecodeLayersPlan::reads() const {
  std::vector<int> r{x, positions, cos_table, sin_table};
  for (const Layer& l : layers)
    r.insert(r.end(), {l.norm1, l.norm2, l.qkv, l.o, l.gate_up, l.down, l.k_cache, l.v_cache});
  if (shape.vocab > 0) r.insert(r.end(), {head_norm, head_w});
  if (shape.embed_rows > 0) r.push_back(token_in);
  return r;
}

std::vector<int> DecodeLayersPlan::also_writes() const {
  std::vector<int> w;
  for (const Layer& l : layers) w.insert(w.end(), {l.k_written, l.v_written});
  if (shape.vocab > 0) w.push_back(logits);
  return w;
}

std::vector<engine::DerivedCopy> decode_layers_pack_copies(const DecodeLayersPlan& plan,
                                                           const std::vector<uint32_t>& t) {
  // t: per layer {norm1, norm2, qkv, o, gate_up, down}
  const DecodeLayersShape& s = plan.shape;
  const uint64_t e = 2;  // bf16 / fp16
  const uint64_t row = static_cast<uint64_t>(s.hidden) * e;  // a weight row of `hidden` inputs
  const int64_t hd = s.head_dim, a_blocks = s.kv_heads * kCluster, tasks = s.intermediate / 4;
  std::vector<engine::DerivedCopy> copies;
  copies.reserve(static_cast<size_t>(s.layers * (a_blocks * 10 + tasks * 2 + tasks / 2) + 2 * s.layers));
  auto copy = [&](uint32_t source, uint64_t offset, uint64_t stride, uint64_t dst, uint32_t rows, uint32_t row_bytes) {
    copies.push_back(engine::DerivedCopy{source, offset, stride, dst, rows, row_bytes});
  };
  uint64_t dst = 0;
  for (int64_t l = 0; l < s.layers; ++l) {
    const DecodeLayersPlan::Layer& L = plan.layers[static_cast<size_t>(l)];
    const uint32_t qkv = t[6 * l + 2], o = t[6 * l + 3], gu = t[6 * l + 4], down = t[6 * l + 5];
    for (int64_t b = 0; b < a_blocks; ++b) {  // q (two heads), k, v: 8 rows each, in two runs of 4
      const int64_t g = b / kCluster, r = b % kCluster;
      const int64_t first[4] = {L.q_col + 2 * g * hd, L.q_col + (2 * g + 1) * hd, L.k_col + g * hd, L.v_col + g * hd};
      for (int64_t which = 0; which < 4; ++which, dst += kStageBytes)
        for (int64_t half = 0; half < 2; ++half) {
          const int64_t d = head_dim_of(r, 4 * half, hd);
          copy(qkv, static_cast<uint64_t>(first[which] + d) * row, row, dst + static_cast<uint64_t>(4 * half) * row, 4,
               static_cast<uint32_t>(row));
        }
      for (int64_t half = 0; half < 2; ++half, dst += kStageBytes)  // o: 64 rows, the two heads' columns
        copy(o, (static_cast<uint64_t>(128 * r + 64 * half) * s.hidden + static_cast<uint64_t>(2 * g * hd)) * e, row, dst,
             64, static_cast<uint32_t>(2 * hd * e));
    }
    const uint64_t gate0 = L.gate_first ? 0 : static_cast<uint64_t>(s.intermediate);
    const uint64_t up0 = L.gate_first ? static_cast<uint64_t>(s.intermediate) : 0;
    for (int64_t task = 0; task < tasks; ++task, dst += kStageBytes) {  // 4 gate rows, then 4 up rows
      copy(gu, (gate0 + static_cast<uint64_t>(4 * task)) * row, row, dst, 4, static_cast<uint32_t>(row));
      copy(gu, (up0 + static_cast<uint64_t>(4 * task)) * row, row, dst + 4 * row, 4, static_cast<uint32_t>(row));
    }
    for (int64_t pair = 0; pair < tasks / 2; ++pair, dst += kStageBytes)  // every down row, 8 columns
      copy(down, static_cast<uint64_t>(8 * pair) * e, static_cast<uint64_t>(s.intermediate) * e, dst,
           static_cast<uint32_t>(s.hidden), static_cast<uint32_t>(8 * e));
  }
  for (int64_t l = 0; l < s.layers; ++l)
    for (int64_t which = 0; which < 2; ++which, dst += row) copy(t[6 * l + which], 0, row, dst, 1, static_cast<uint32_t>(row));
  return copies;
}

void DecodeLayersPlan::lower(LowerContext& ctx, engine::Step& step) const {
  const std::string unsupported = decode_layers_unsupported(shape);
  if (!unsupported.empty()) throw CompileError("internal: a decode-layers step was planned for " + unsupported);
  step.kind = engine::StepKind::kKernel;
  engine::KernelStep& ks = step.kernel;
  ks.function = ctx.kernel_name("kiln_decode_layers");
  ctx.add_module_source(ks.function, decode_layers_kernel_source(shape, kernel, ks.function), 90);

  std::vector<uint32_t> weights;
  for (const Layer& l : layers)
    for (int v : {l.norm1, l.norm2, l.qkv, l.o, l.gate_up, l.down}) weights.push_back(ctx.tensor(v));
  engine::DerivedWeight packed;
  packed.name = "decode_layers_packed";
  packed.nbytes = static_cast<uint64_t>(decode_layers_packed_elems(shape)) * 2;
  packed.copies = decode_layers_pack_copies(*this, weights);
  const uint32_t packed_tensor =
      ctx.add_derived_weight(std::move(packed), shape.dtype, {decode_layers_packed_elems(shape)});
  const uint32_t sync = ctx.add_state(sync_key, static_cast<uint64_t>(decode_layers_sync_bytes(shape, kernel)));

  // The grid: as many clusters as are co-resident (the runtime decides, up to the most), at least
  // the fewest that can split the MLP tasks.
  const int64_t fewest = decode_layers_fewest_blocks(shape, kernel);
  if (fewest == 0) throw CompileError("internal: no grid of at most 32 clusters fits the decode-layers step");
  ks.grid[0] = static_cast<uint32_t>(kDecodeLayersMaxClusters * kCluster);
  ks.min_blocks = static_cast<uint32_t>(fewest);
  ks.block[0] = 288;
  ks.shared_bytes = static_cast<uint32_t>(decode_layers_shared_bytes(kernel));
  ks.args = {ctx.tensor_arg(shape.vocab > 0 ? token : out), ctx.tensor_arg(x)};
  engine::KernelArg a;
  a.kind = engine::KernelArgKind::kTensor;
  a.tensor = packed_tensor;
  ks.args.push_back(a);
  ks.args.insert(ks.args.end(), {ctx.tensor_arg(positions), ctx.tensor_arg(cos_table), ctx.tensor_arg(sin_table)});
  a.tensor = sync;
  ks.args.push_back(a);
  for (const Layer& l : layers) ks.args.push_back(ctx.tensor_arg(l.k_cache));
  for (const Layer& l : layers) ks.args.push_back(ctx.tensor_arg(l.v_cache));
  if (shape.vocab > 0)
    ks.args.insert(ks.args.end(), {ctx.tensor_arg(logits), ctx.tensor_arg(head_w), ctx.tensor_arg(head_norm)});
  if (shape.embed_rows > 0) ks.args.push_back(ctx.tensor_arg(token_in));
}

}  // namespace kiln::ops
