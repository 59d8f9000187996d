// A language model's decode layers as ONE persistent kernel (sm_90+): every layer of a Llama-style
// stack (and optionally its head: final norm, lm_head, argmax), batch 1, one new token, with two grid-wide dependencies a layer instead of a kernel an
// op. Thread-block clusters of 8 do what is not all-to-all inside the cluster (q|k|v, rotary,
// cache write, attention over the cache, through DSMEM pushes); the o-projection and the MLP
// become split-k sums added into the next residual row. A producer warp a block streams the
// block's weights (a load-time repacked copy, see decode_layers_pack_*) and cached rows into a
// shared-memory ring, running ahead across the waits. The design, its measurements and the plan
// for the engine step: docs/design_llm.md, "Two grid-wide dependencies a layer" and after.
//
// Kernel parameters, in order:
//   T* out            the last layer's output row [hidden] (first: the engine's convention)
//   const T* x        the token's embedding row [hidden]
//   const T* packed   the repacked weights: decode_layers_packed_elems(shape) elements
//   const long long* pos   the token's position P (P cached rows before it); P outside
//                          [0, max_len) writes no cache row and makes `out` NaN
//   const T* cos, const T* sin   the rotary tables, [max_len][head_dim] (rotate-half form: entry d
//                                and d + head_dim / 2 alike, as Hugging Face's rotary gives them)
//   unsigned* sync    decode_layers_sync_bytes(shape, options) bytes, zeroed once (a context's state):
//                     arrival counters, the launch epoch, the residual rows; nothing else writes it
//   T* k_cache_0 .. T* k_cache_{L-1}, T* v_cache_0 .. T* v_cache_{L-1}
//                     each layer's cache, [kv_heads][max_len][head_dim]
//   with a head (DecodeLayersShape::vocab > 0) `out` is the token, long long [1], the argmax of
//   the logits, and three more follow:
//     T* logits [vocab]; const T* head_w, the lm_head [vocab][hidden] as the model has it (8
//     consecutive rows are one stage: no repacking); const T* head_norm, the final RMSNorm [hidden]
//   with the embedding (DecodeLayersShape::embed_rows > 0) `x` is the embedding table and
//     const long long* token_in follows (before `trace`): the token whose row is the input
//   unsigned long long* trace   only when DecodeLayersKernelOptions::trace
// Launch: gridDim.x a multiple of 8 (clusters of 8, compiled in), at least 8 * kv_heads blocks,
// all co-resident (the blocks wait on each other); 288 threads; decode_layers_shared_bytes(opts)
// of dynamic shared memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine_format/engine_desc.h"

namespace kiln::ops {

// The kernel's layout: blocks in clusters of 8, weights and cached rows in 16 KB stages.
constexpr int64_t kDecodeLayersCluster = 8;
constexpr int64_t kDecodeLayersStageBytes = 16384;
// The most clusters the step's grid may have (the runtime launches as many as are co-resident).
constexpr int64_t kDecodeLayersMaxClusters = 32;

struct DecodeLayersShape {
  int64_t hidden = 0, intermediate = 0, layers = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int64_t max_len = 0;  // the cache's rows a kv head
  double eps = 1e-5;    // the RMSNorms'
  engine::DType dtype = engine::DType::kBFloat16;
  // > 0: the head is folded in too (the final RMSNorm with head_eps, the lm_head's `vocab` rows,
  // their argmax): the kernel then writes the token (int64) as its output and the logits.
  int64_t vocab = 0;
  double head_eps = 1e-5;
  // > 0: the embedding is folded in too: `x` is the embedding table [embed_rows][hidden] and a
  // last parameter, the token (long long [1]), picks the row.
  int64_t embed_rows = 0;
};

// Why the persistent kernel cannot run `shape`, or "" when it can. This version takes the
// shapes its register and stage layout were built for: hidden 1024, head_dim 64, two query heads
// a kv head, bf16 or fp16.
std::string decode_layers_unsupported(const DecodeLayersShape& shape);

struct DecodeLayersKernelOptions {
  int stages = 13;      // the shared-memory ring's 16 KB stages (13 is the most that fits)
  int a_tasks = 8;      // MLP tasks (4 intermediate columns each) of a block that also has phase-A work; even
  // The producer's bulk copies in flight at most (0: the ring's depth). A phase's arrival is a
  // release, which waits for the SM's copies in flight, so few are kept in flight.
  int max_inflight = 2;
  // >= 0: the copies in flight at most while the block's previous phase has not arrived yet (0:
  // none issued until it has), max_inflight otherwise; -1: max_inflight throughout. 2 and 1 (the
  // defaults) against 1 throughout: 0.370 against 0.381 ms a token on an H100 (four runs in three
  // calls, benchmarks/results/decode_layers_release_inflight*_h100.txt).
  int release_inflight = 1;
  // The head's copies in flight at most once the block's last layer phase has arrived (0: the
  // ring's depth): nothing is released after them but the head's own end.
  int head_inflight = 2;
  // Cached rows a block's attention stage takes (64: keys and values in one ring slot; 128: two
  // slots, half the stages, so a block's share of positions 513-1024 is one stage, not two; 0: by
  // position, 64 up to position 512 and 128 past it, both compiled in). 0 by default: 2432.8
  // against 64's 2420.1 tokens/s in llm_bench's decode at positions 512-767, each of three rounds
  // above 64's (H100, 69e3a56); the micro-benchmark at position 640: 0.357 against 0.371 ms.
  int kv_rows = 0;
  // How a phase hands its output row to the next. 0: each block adds its part with float atomics,
  // then arrives on a counter (a release, which waits for the block's copies in flight); the
  // readers wait for the counter, then read the row. 1: counted rows: each element is a u64 that
  // sums the contributions in fixed point (2^-28) and counts them, so the readers poll the row
  // itself and no phase but the last arrives; the sums no longer depend on the order of the adds
  // (the same token every run), and a contribution of 2^23 or more makes the output NaN. 2: as 1,
  // but one thread polls an element before the block's threads poll theirs. The sync area grows
  // by 4 * layers rows of 8-byte elements. The micro-benchmark (H100, 69e3a56, twice): 1 with 8
  // tasks 0.334 against 0.345 ms at position 512; llm_bench has measured it only with a_tasks 10
  // (slower, as a_tasks 10 is in the micro-benchmark): the next end-to-end A/B.
  int counted_rows = 0;
  // Stages prefetched into L2 ahead of the ring's copies (cp.async.bulk.prefetch.L2; 0: none), so
  // the DRAM reads run deeper than the copies in flight, which stay few (see max_inflight).
  // Measured slower (H100, 69e3a56): the weight stream alone 0.469 ms with 16 against 0.279
  // without; llm_bench 1697 against 2420 tokens/s. Kept for measuring on other GPUs.
  int l2_prefetch = 0;
  // How phase A's q|k|v reach the rotary. 0: warp w computes column w of each of q, q, k, v, and
  // after a block barrier 32 threads rotate (the partner column is another warp's) and push. 1:
  // warp w computes a column and its partner (of both q heads, or of k and v), rotates them and
  // pushes: one block barrier a layer fewer, the pushes spread over every warp.
  int warp_rotary = 0;
  // How a phase normalizes its input row. 0: the block sums the squares (a block barrier), writes
  // the normalized row to shared memory (another) and each warp loads its share. 1: after the raw
  // row is in shared memory every warp sums the squares of the 32 elements each lane holds and
  // normalizes them in its registers: one block barrier a phase instead of three.
  int warp_norm = 0;
  // > 0: the copies in flight at most of a block without phase-A work (its stages are the MLP's,
  // needed only after phase A), so the phase-A blocks' stages, on the layer's chain, find the DRAM
  // less busy; 0: max_inflight, as every block.
  int b_inflight = 0;
  bool trace = false;   // a last parameter receiving globaltimer marks (micro-benchmark)
  // 1: the kernel; 0: every product skipped (timing only); 2: nothing but the weight stream (timing only).
  int compute = 1;
};

// The options a user may set (kiln.compile(persistent_decode={name: value})): stages, a_tasks,
// max_inflight, release_inflight, head_inflight, kv_rows, counted_rows, l2_prefetch, warp_rotary,
// warp_norm, b_inflight. Sets `name` to `value`, or returns why not (an unknown name, listing the known ones).
// trace and compute are the micro-benchmark's, not an engine's.
std::string set_decode_layers_option(DecodeLayersKernelOptions& options, const std::string& name, int64_t value);
// The names set_decode_layers_option takes (python/kiln/_options.py lists them too; a test compares).
std::vector<std::string> decode_layers_option_names();
// "stages=13,a_tasks=8,...": every user-settable option, for the engine's metadata.
std::string decode_layers_options_text(const DecodeLayersKernelOptions& options);
// Why the options cannot build a kernel whatever the grid (a value out of its range), or "".
std::string decode_layers_options_invalid(const DecodeLayersKernelOptions& options);

// Why a launch of `blocks` blocks cannot run the kernel (the MLP tasks do not split among them,
// not whole clusters, fewer than a cluster a kv head), or "" when it can. The blocks must also
// all be co-resident: the caller checks that against the GPU.
std::string decode_layers_grid_unfit(const DecodeLayersShape& shape, const DecodeLayersKernelOptions& options,
                                     int64_t blocks);
// The fewest blocks of at most kDecodeLayersMaxClusters clusters that can run it (0: none can).
int64_t decode_layers_fewest_blocks(const DecodeLayersShape& shape, const DecodeLayersKernelOptions& options);

// The kernel `name`'s CUDA source (no headers needed; NVRTC or nvcc, sm_90+).
std::string decode_layers_kernel_source(const DecodeLayersShape& shape, const DecodeLayersKernelOptions& options,
                                        const std::string& name);

// Elements of the packed weights: per layer, 16 KB stages (phase-A blocks' q, q, k, v, o, o; a
// gate|up stage a task of 4 columns; a down stage a pair of tasks), then every layer's two norm
// weights.
int64_t decode_layers_stages_per_layer(const DecodeLayersShape& shape);
int64_t decode_layers_packed_elems(const DecodeLayersShape& shape);
int64_t decode_layers_sync_bytes(const DecodeLayersShape& shape, const DecodeLayersKernelOptions& options);
int64_t decode_layers_shared_bytes(const DecodeLayersKernelOptions& options);

}  // namespace kiln::ops
