// Micro-benchmark (benchmarks/micro/README.md): can the 410M Llama's 24 decode layers reach 60%
// of the memory roofline as ONE persistent kernel with only TWO grid-wide dependencies a layer?
// Every earlier persistent experiment kept one grid-wide dependency per product (96-151 a token)
// and found each costs about as much as a kernel boundary (dependency_latency.cu: ~1.1 us), which
// alone is most of the H200's 0.178 ms roofline. Here the dependencies that are not all-to-all
// stay inside a thread-block cluster, and the all-to-all ones become split-k reductions:
//
//   phase A, clusters 0-7 (cluster g of 8 blocks = kv head g and its two query heads):
//     RMSNorm(x) -> q|k|v (each block 8 head dims of each, rotary pairs in one block) -> DSMEM
//     to the cluster -> cache write -> attention over the P cached positions + the new one (each
//     block an eighth of them, both query heads, merged through DSMEM) -> the two heads' slice of the
//     o-projection, added into the next residual row with red.global.add (split-k over kv heads;
//     cluster 0 adds the residual itself).
//   phase B, every block: RMSNorm(x) -> gate|up of its intermediate columns -> SiLU * up -> those
//     columns of the down projection for all 1024 outputs -> summed across the cluster (each
//     block pushes its partial sums to the rows' owners with st.async) -> red.global.add into
//     the next residual row. Blocks that have no phase-A work take more columns.
//   Two arrival counters separate the phases (2 grid-wide dependencies a layer, 48 a token).
//   Only as many clusters of 8 as can be co-resident are launched (15 on a 132-SM H100).
//
// The weights never wait for a dependency: a producer warp a block streams the block's whole
// token of weights (repacked per block at load time) and its cached key/value rows into a
// 13-stage shared-memory ring (cp.async.bulk, 16 KB stages), running ahead across the waits as
// far as the ring allows; eight consumer warps compute from the ring. Copies in flight are capped
// (1 is best on the H100): a release (the phase's closing arrival) waits for the SM's copies in
// flight, and a deep queue makes each copy microseconds late. The cluster's exchanges are
// st.async pushes onto the receivers' own barriers, never a cluster barrier with release arrivals.
//
// The kernel is the engine's: src/ops/decode_layers_kernel.cpp's source, compiled here with NVRTC
// for this GPU with the micro-benchmark's shapes (seventh session). What an engine step needs and
// the kernel does since then: the position P comes
// from device memory (a graph replays the same arguments every token): the cluster splits the
// cached rows [0, P) into 64-row stages among its blocks (online softmax across a block's
// stages), the producer streams that many, and the last block takes the new position; the
// arrival counters, the launch's epoch and the residual rows live in a sync area zeroed once,
// every target counted from the epoch the last block of the previous launch wrote.
// The variants measured before (cluster syncs, relaxed arrivals, pushes in phase B only; sixth
// session, benchmarks/results/decode_layers_*_h100.txt) are in the history at 0c3586a.
//
// Checked against a plain kernel an op (logical, unpacked weights): after 1 and 24 layers by
// direct launches, then one captured CUDA graph replayed at positions 0 to 2047 (the fp32 row in the
// sync area against the reference, the bf16 output against that row rounded). Timed: median of
// CUDA-event-timed launches and graph replays; also the stream alone and a trace of every block's
// phase times (globaltimer); each variant is the source compiled with other options.
// Shapes, device helpers, repacking and the trace summary: decode_layers_support.cuh; weights,
// reference, check and timing: decode_layers_model.cuh.
//   nvcc -O3 -arch=sm_90 -std=c++17 -Isrc -o /tmp/dlp benchmarks/micro/decode_layers_persistent.cu \
//     src/ops/decode_layers_kernel.cpp -lnvrtc && /tmp/dlp [tasks [cap [release cap]]]
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nvrtc.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <string>
#include <vector>

#include "decode_layers_model.cuh"
#include "micro_util.cuh"
#include "ops/decode_layers_kernel.h"

namespace {

using kiln::ops::DecodeLayersKernelOptions;
using kiln::ops::DecodeLayersShape;

DecodeLayersShape shape_of(int layers) {
  DecodeLayersShape s;
  s.hidden = kHidden, s.intermediate = kInter, s.layers = layers, s.heads = kHeads, s.kv_heads = kKvHeads;
  s.head_dim = kHeadDim, s.max_len = kMaxLen, s.eps = 1e-5, s.dtype = kiln::engine::DType::kBFloat16;
  return s;
}

// The engine's kernel source for these options, compiled for this GPU and loaded.
struct Compiled {
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr;
  DecodeLayersKernelOptions options;
  int layers = 0;
  size_t shared = 0;
};
Compiled compile(int layers, const DecodeLayersKernelOptions& o, int sm) {
  const std::string name = "kiln_decode_layers";
  const std::string src = kiln::ops::decode_layers_kernel_source(shape_of(layers), o, name);
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, src.c_str(), "decode_layers.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) std::exit(1);
  const std::string arch = "--gpu-architecture=sm_" + std::to_string(sm);
  const char* opts[] = {arch.c_str(), "--std=c++17", "-default-device"};
  const nvrtcResult r = nvrtcCompileProgram(prog, 3, opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::vector<char> log(n + 1);
    nvrtcGetProgramLog(prog, log.data());
    std::printf("NVRTC: %s\n%s\n", nvrtcGetErrorString(r), log.data());
    std::exit(1);
  }
  size_t bytes = 0;
  nvrtcGetCUBINSize(prog, &bytes);
  std::vector<char> cubin(bytes);
  nvrtcGetCUBIN(prog, cubin.data());
  nvrtcDestroyProgram(&prog);
  Compiled c;
  c.options = o;
  c.layers = layers;
  c.shared = static_cast<size_t>(kiln::ops::decode_layers_shared_bytes(o));
  CK(cudaLibraryLoadData(&c.library, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  CK(cudaLibraryGetKernel(&c.kernel, c.library, name.c_str()));
  CK(cudaFuncSetAttribute(reinterpret_cast<const void*>(c.kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                          static_cast<int>(c.shared)));
  return c;
}

// Waits for the stream, at most `seconds`: a persistent kernel whose blocks wait for each other
// hangs rather than fails when a hand-off is wrong, and the rest of the run is worth having.
void settle(cudaStream_t stream, const char* what, double seconds = 5.0) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) CK(state);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) {
      std::printf("HANG: %s did not finish in %.0f s <-- WRONG\n", what, seconds);
      std::exit(3);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int sms = 0, dev = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  const int sm = 10 * prop.major + prop.minor;
  std::printf("%s, %d SMs\n", prop.name, sms);
  Model m;  // random weights, cache, the token's embedding row, the reference's buffers
  const Weights wt = m.weights();
  CK(cudaDeviceSynchronize());

  // Bytes a token at position P: every weight once, the P cached rows and the new one (k and v).
  const double weight_bytes = (double)kLayers * 2 * (2 * kDq + 2 * kDkv + 3 * kDgu);
  auto bytes_at = [&](int P) { return weight_bytes + (double)kLayers * kKvHeads * (P + 1) * kHeadDim * 2 * 2; };
  // The datasheet bandwidth the issue's roofline uses (H200 4.8 TB/s, H100 SXM 3.35 TB/s).
  const double peak = std::strstr(prop.name, "H200") ? 4.8e12 : 3.35e12;
  std::printf("24 layers: %.1f MB of weights + %.1f MB of cache at position %d; datasheet bandwidth %.2f TB/s\n",
              weight_bytes / 1e6, (bytes_at(kPos) - weight_bytes) / 1e6, kPos, peak / 1e12);

  DecodeLayersKernelOptions base;
  base.a_tasks = argc > 1 ? std::atoi(argv[1]) : 8;  // 8 of 5-10 fastest on an H100 at 512 (sixth session)
  if (argc > 2) base.max_inflight = std::atoi(argv[2]);  // else the engine's defaults
  if (argc > 3) base.release_inflight = std::atoi(argv[3]);
  if (argc > 4) base.kv_rows = std::atoi(argv[4]);
  const int trace_pos = argc > 5 ? std::atoi(argv[5]) : kPos;  // where the trace is taken
  if (argc > 6) base.counted_rows = std::atoi(argv[6]);
  if (argc > 7) base.l2_prefetch = std::atoi(argv[7]);
  if (argc > 8) base.warp_rotary = std::atoi(argv[8]);
  if (argc > 9) base.warp_norm = std::atoi(argv[9]);
  if (argc > 10) base.b_inflight = std::atoi(argv[10]);
  auto with = [&](int inflight, bool trace, int compute) {
    DecodeLayersKernelOptions o = base;
    o.max_inflight = inflight, o.trace = trace, o.compute = compute;
    return o;
  };
  const Compiled main_kernel = compile(kLayers, base, sm);
  int clusters = 0;
  {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(16 * kCluster);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = main_kernel.shared;
    CK(cudaOccupancyMaxActiveClusters(&clusters, reinterpret_cast<const void*>(main_kernel.kernel), &cfg));
  }
  clusters = std::min(clusters, 16);
  const int nblocks = clusters * kCluster;
  std::printf("%zu bytes of shared memory a block; %d clusters of %d co-resident\n", main_kernel.shared, clusters, kCluster);
  const std::string unfit = kiln::ops::decode_layers_grid_unfit(shape_of(kLayers), base, nblocks);
  if (!unfit.empty()) {
    std::printf("cannot launch: %s\n", unfit.c_str());
    return 1;
  }
  std::printf("%d blocks: %d with phase A (%d MLP tasks each), %d without; %d stages of 16 KB a layer; %d copies in flight\n",
              nblocks, kABlocks, base.a_tasks, nblocks - kABlocks, kStagesPerLayer, base.max_inflight);
  __nv_bfloat16* const packed = pack_weights(wt, kLayers);
  __nv_bfloat16* const packed1 = pack_weights(wt, 1);  // layer 0 alone, for the one-layer kernel

  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The sync area (zeroed once, as an engine context would, and again only where a check or a
  // timing wants a clean start), the output row and the position.
  DecodeLayersKernelOptions largest_sync = base;  // the sync area of any variant below
  largest_sync.counted_rows = 1;
  const size_t sync_bytes = static_cast<size_t>(kiln::ops::decode_layers_sync_bytes(shape_of(kLayers), largest_sync));
  unsigned* sync = alloc<unsigned>(sync_bytes / 4);
  const float* fin = reinterpret_cast<const float*>(sync + 4) + 3 * kHidden;  // the last phase's fp32 row
  __nv_bfloat16* out = alloc<__nv_bfloat16>(kHidden);
  long long* d_pos = alloc<long long>(1);
  auto reset = [&] { CK(cudaMemsetAsync(sync, 0, sync_bytes, stream)); };
  auto set_pos = [&](long long P) { CK(cudaMemcpyAsync(d_pos, &P, 8, cudaMemcpyHostToDevice, stream)); };
  unsigned long long* trace = alloc<unsigned long long>((size_t)nblocks * 2 * kLayers * kMarks);
  auto launch = [&](const Compiled& k) {
    std::vector<void*> values = {out, m.x0b, k.layers == 1 ? packed1 : packed, d_pos, m.cos_b, m.sin_b, sync};
    for (int which = 0; which < 2; ++which)
      for (int l = 0; l < k.layers; ++l) values.push_back((which ? m.vc : m.kc) + (size_t)l * kKvHeads * kMaxLen * kHeadDim);
    if (k.options.trace) values.push_back(trace);
    std::vector<void*> args(values.size());
    for (size_t j = 0; j < values.size(); ++j) args[j] = &values[j];
    CK(cudaLaunchKernel(reinterpret_cast<const void*>(k.kernel), dim3(nblocks), dim3(kThreads), args.data(), k.shared,
                        stream));
    CK(cudaGetLastError());
  };
  // The output row: bf16, the fp32 row rounded (every element exactly).
  auto out_matches = [&]() {
    std::vector<float> f(kHidden);
    std::vector<__nv_bfloat16> o(kHidden);
    CK(cudaMemcpy(f.data(), fin, kHidden * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(o.data(), out, kHidden * 2, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int j = 0; j < kHidden; ++j) bad += __bfloat162float(o[j]) != __bfloat162float(__float2bfloat16(f[j]));
    if (bad) std::printf("output row: %d of %d elements are not the fp32 row rounded <-- WRONG\n", bad, kHidden);
    return bad == 0;
  };
  char what[160];
  std::snprintf(what, sizeof what, "%d copies in flight", base.max_inflight);
  bool ok = true;
  // A direct launch of `k` at position P checked against the plain kernels (the fp32 row and the
  // output rounded from it); a launch that does not finish is reported as a hang.
  auto check_launch = [&](const Compiled& k, int P, const char* label) {
    set_pos(P);
    launch(k);
    settle(stream, label);
    m.reference(stream, k.layers, P);
    CK(cudaStreamSynchronize(stream));
    ok = m.check(fin, k.layers, P, label) && ok;
    ok = out_matches() && ok;
  };
  {
    const Compiled one = compile(1, base, sm);  // direct launches from a zeroed sync area
    for (const Compiled* k : {&one, &main_kernel}) {
      reset();
      check_launch(*k, kPos, what);
    }
    CK(cudaLibraryUnload(one.library));
  }
  // One captured launch replayed at every position below: the epoch and the position come from
  // device memory, as they do in an engine's CUDA graph.
  reset();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  launch(main_kernel);
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  std::snprintf(what, sizeof what, "graph replay, %d copies in flight", base.max_inflight);
  unsigned epoch = 0;
  for (int P : {0, 1, 63, 64, 65, 300, 511, 512, 1000, 2047}) {
    set_pos(P);
    CK(cudaGraphLaunch(exec, stream));
    m.reference(stream, kLayers, P);
    CK(cudaStreamSynchronize(stream));
    ++epoch;
    ok = m.check(fin, kLayers, P, what) && ok;
    ok = out_matches() && ok;
  }
  unsigned dev_epoch = 0;
  CK(cudaMemcpy(&dev_epoch, sync + 2, 4, cudaMemcpyDeviceToHost));
  if (dev_epoch != epoch) {
    std::printf("epoch after %u launches: %u <-- WRONG\n", epoch, dev_epoch);
    ok = false;
  }
  {  // a position past the cache: no row written, the output NaN
    std::vector<__nv_bfloat16> before(kHeadDim), after(kHeadDim), o(kHidden);
    set_pos(kMaxLen);
    CK(cudaGraphLaunch(exec, stream));
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(o.data(), out, kHidden * 2, cudaMemcpyDeviceToHost));
    int nan = 0;
    for (int j = 0; j < kHidden; ++j) nan += std::isnan(__bfloat162float(o[j]));
    std::printf("position %d (past the cache): %d of %d outputs NaN %s\n", kMaxLen, nan, kHidden, nan == kHidden ? "ok" : "<-- WRONG");
    ok = ok && nan == kHidden;
  }
  // The kernel's other code path (kv_rows: what it computes at once, not only when): checked at
  // the positions where its stages split differently, and timed beside the main kernel below.
  // (the other two of 64, 128 and 0 = by position)
  DecodeLayersKernelOptions alt_options = base, alt2_options = base;
  alt_options.kv_rows = base.kv_rows == 64 ? 128 : 64;
  alt2_options.kv_rows = base.kv_rows == 0 ? 128 : 0;
  const Compiled alt = compile(kLayers, alt_options, sm), alt2 = compile(kLayers, alt2_options, sm);
  for (const Compiled* k : {&main_kernel, &alt, &alt2})
    for (int P : {127, 128, 129, 512, 513, 640, 767}) {
      std::snprintf(what, sizeof what, "%d cached rows a stage", k->options.kv_rows);
      reset();
      check_launch(*k, P, what);
    }
  // How a phase hands its row to the next (counted_rows) with the copies in flight each allows:
  // checked at positions launched one after another (the epoch's parity picks the counted rows'
  // set), then timed below.
  // The phase-A blocks' MLP share (a_tasks) too: without arrivals the balance between the blocks
  // with phase-A work and those without may move.
  // And stages prefetched into L2 ahead of the ring (l2_prefetch), with which the DRAM reads need
  // not be the copies in flight; and each warp rotating its own q|k|v pair (warp_rotary).
  struct Handoff {
    int counted, inflight, release, a_tasks, l2, rotary, norm, b_inflight = 0;
  };
  const Handoff handoffs[] = {
      {0, 2, 1, 8, 0, 0, 0},   {1, 2, 1, 8, 0, 0, 0},   {1, 2, 1, 10, 0, 0, 0},  {2, 2, 1, 10, 0, 0, 0},
      {1, 2, 1, 12, 0, 0, 0},  {1, 2, 1, 10, 0, 1, 0},  {1, 2, 1, 10, 0, 0, 1},  {1, 2, 1, 10, 0, 1, 1},
      {0, 2, 1, 8, 16, 0, 0},  {1, 2, 1, 10, 8, 0, 0},  {1, 2, 1, 10, 16, 0, 0}, {1, 2, 1, 10, 32, 0, 0},
      {1, 3, 1, 10, 16, 0, 0}, {1, 2, -1, 10, 16, 0, 0}, {1, 4, 2, 10, 32, 0, 0}, {1, 2, 1, 10, 16, 1, 1},
      {1, 3, 1, 10, 0, 0, 0, 1}, {1, 4, 1, 10, 0, 0, 0, 1}, {1, 3, 1, 10, 16, 0, 0, 1}, {1, 4, 1, 10, 16, 1, 1, 1}};
  std::vector<Compiled> handoff_kernels;
  for (const Handoff& h : handoffs) {
    DecodeLayersKernelOptions o = base;
    o.counted_rows = h.counted, o.max_inflight = h.inflight, o.release_inflight = h.release, o.a_tasks = h.a_tasks;
    o.l2_prefetch = h.l2, o.warp_rotary = h.rotary, o.warp_norm = h.norm, o.b_inflight = h.b_inflight;
    if (!kiln::ops::decode_layers_grid_unfit(shape_of(kLayers), o, nblocks).empty()) continue;
    handoff_kernels.push_back(compile(kLayers, o, sm));
    reset();
    for (int P : {5, 64, 700, 129}) {
      std::snprintf(what, sizeof what, "counted_rows %d, %d in flight (b %d), %d tasks, l2 %d, warp_rotary %d, warp_norm %d",
                    h.counted, h.inflight, h.b_inflight, h.a_tasks, h.l2, h.rotary, h.norm);
      check_launch(handoff_kernels.back(), P, what);
    }
  }
  std::printf("%s\n", ok ? "numerics: ok" : "numerics: WRONG");

  set_pos(trace_pos);
  for (int compute : {1, 0}) {  // where a layer's time goes
    const Compiled traced = compile(kLayers, with(base.max_inflight, true, compute), sm);
    const size_t marks = (size_t)nblocks * 2 * kLayers * kMarks;
    CK(cudaMemsetAsync(trace, 0, marks * 8, stream));
    reset();  // the hand-off variants above count their arrivals differently
    launch(traced);
    settle(stream, "the traced launch");
    std::vector<unsigned long long> tr(marks);
    CK(cudaMemcpy(tr.data(), trace, marks * 8, cudaMemcpyDeviceToHost));
    std::printf("(position %d, %d copies in flight, %d cached rows a stage)\n", trace_pos, base.max_inflight, base.kv_rows);
    print_trace(tr, nblocks, compute);
    CK(cudaLibraryUnload(traced.library));
  }
  // Copies in flight (max_inflight, release_inflight): a cap throughout, or a deeper one with a
  // shallow one while the block's previous phase has not arrived; and the weight stream alone.
  std::vector<Compiled> caps;
  const int2 cap_variants[] = {{1, -1}, {2, -1}, {2, 1}, {3, 1}, {2, 0}};
  for (const int2 v : cap_variants) {
    DecodeLayersKernelOptions o = with(v.x, false, 1);
    o.release_inflight = v.y;
    caps.push_back(v.x == base.max_inflight && v.y == base.release_inflight ? main_kernel : compile(kLayers, o, sm));
  }
  const Compiled stream_only = compile(kLayers, with(base.max_inflight, false, 2), sm);
  DecodeLayersKernelOptions l2_stream = with(base.max_inflight, false, 2);
  l2_stream.l2_prefetch = base.l2_prefetch ? 0 : 16;  // the stream with L2 prefetches if the base has none, else without
  const Compiled stream_other = compile(kLayers, l2_stream, sm);
  auto report = [&](int round, const char* label, int P, float ms) {
    std::printf("round %d: %s, position %d: median %.4f ms, %.0f GB/s, %.1f%% of peak\n", round, label, P, ms,
                bytes_at(P) / ms / 1e6, 100.0 * bytes_at(P) / ms / 1e-3 / peak);
  };
  for (int round = 0; round < 2; ++round) {
    set_pos(kPos);
    for (const Compiled& k : handoff_kernels) {  // each hand-off with its copies in flight
      reset();
      std::snprintf(what, sizeof what,
                    "persistent, counted_rows %d, %d copies in flight (b %d), %d before the arrival, %d tasks, l2 %d, "
                    "warp_rotary %d, warp_norm %d",
                    k.options.counted_rows, k.options.max_inflight, k.options.b_inflight, k.options.release_inflight,
                    k.options.a_tasks, k.options.l2_prefetch, k.options.warp_rotary, k.options.warp_norm);
      report(round, what, kPos, median_ms(stream, [&] { launch(k); }, 10, 100));
    }
    for (const Compiled& k : caps) {  // direct launches at each cap
      reset();
      if (k.options.release_inflight < 0)
        std::snprintf(what, sizeof what, "persistent, %d copies in flight", k.options.max_inflight);
      else
        std::snprintf(what, sizeof what, "persistent, %d copies in flight, %d before the previous phase's arrival",
                      k.options.max_inflight, k.options.release_inflight);
      report(round, what, kPos, median_ms(stream, [&] { launch(k); }, 10, 100));
    }
    for (int P : {512, 640, 767, 1024}) {  // the benchmark decodes at 512-767
      set_pos(P);
      for (const Compiled* k : {&main_kernel, &alt, &alt2, &main_kernel}) {
        reset();
        std::snprintf(what, sizeof what, "persistent, %d cached rows a stage", k->options.kv_rows);
        report(round, what, P, median_ms(stream, [&] { launch(*k); }, 10, 100));
      }
    }
    set_pos(kPos);
    std::snprintf(what, sizeof what, "the weight stream ALONE, l2 %d", base.l2_prefetch);
    report(round, what, kPos, median_ms(stream, [&] { launch(stream_only); }, 10, 100));
    std::snprintf(what, sizeof what, "the weight stream ALONE, l2 %d", l2_stream.l2_prefetch);
    report(round, what, kPos, median_ms(stream, [&] { launch(stream_other); }, 10, 100));
    reset();
    std::snprintf(what, sizeof what, "graph replay, %d copies in flight", base.max_inflight);
    for (int P : {128, kPos, 1024, 2047}) {
      set_pos(P);
      report(round, what, P, median_ms(stream, [&] { CK(cudaGraphLaunch(exec, stream)); }, 10, 100));
    }
    report(round, "reference (plain kernels, not tuned, for scale)", kPos,
           median_ms(stream, [&] { m.reference(stream, kLayers, kPos); }, 3, 20));
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ok ? 0 : 2;
}
