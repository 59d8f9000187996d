// Micro-benchmark (benchmarks/micro/README.md): what does one grid-wide dependency cost with no
// work around it? A decode step is about 100 dependent phases (each product needs all of the
// previous one's output), so this floor, times the phases, is latency no design can hide unless
// the weights of later phases stream across it. Two ways to separate the phases:
//   kernels:  one kernel a phase, 132 blocks each, in one CUDA graph; with programmatic dependent
//             launch (griddepcontrol.wait, then launch_dependents) or plain stream order;
//   counter:  one persistent kernel, 132 blocks; at each phase every block publishes a word, arrives
//             on a counter (red.release.gpu, or __threadfence + atomicAdd) and spins
//             (ld.acquire.gpu) until all blocks have arrived, then reads one word of every block
//             (what a consumer of the phase's output must do); also one counter a phase versus
//             one counter for all phases.
// Median of 200 graph launches (or kernel launches) over 96 phases, CUDA events; a phase's cost is
// the total over 96.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "micro_util.cuh"

constexpr int kPhases = 96;

// One phase as its own kernel: block b reads one word the previous phase wrote (another block's:
// what a consumer of that phase's output must do), then writes its own. The words are
// double-buffered by phase parity, so a phase never overwrites what it reads.
template <bool PDL>
__global__ void phase_kernel(unsigned* data, int phase, unsigned* errors) {
  if (PDL) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
  }
  if (threadIdx.x != 0) return;
  const unsigned B = gridDim.x;
  if (phase > 0) {
    const unsigned got = __ldcg(&data[((phase - 1) % 2) * B + (blockIdx.x + 1) % B]);
    if (got != static_cast<unsigned>(phase - 1)) atomicAdd(errors, 1u);
  }
  __stcg(&data[(phase % 2) * B + blockIdx.x], static_cast<unsigned>(phase));
}

// All phases in one kernel. At each phase a block writes its word, arrives, spins until every
// block has arrived, then reads another block's word of the phase (double-buffered by parity: by
// the time a block writes the same buffer again, every block has passed the phase in between).
// FENCE: __threadfence + atomicAdd instead of red.release. PER_PHASE: counter[p] a phase (each
// reaching gridDim.x) instead of one counter reaching (p + 1) * gridDim.x. The counters start at
// zero (cleared before each launch).
template <bool FENCE, bool PER_PHASE>
__global__ void counter_kernel(unsigned* data, unsigned* counters, unsigned* errors) {
  if (threadIdx.x != 0) return;
  const unsigned B = gridDim.x;
  for (int p = 0; p < kPhases; ++p) {
    __stcg(&data[(p % 2) * B + blockIdx.x], static_cast<unsigned>(p));
    unsigned* c = PER_PHASE ? &counters[p] : &counters[0];
    const unsigned target = PER_PHASE ? B : (p + 1) * B;
    if (FENCE) {
      __threadfence();
      atomicAdd(c, 1u);
    } else {
      red_release(c, 1u);
    }
    while (ld_acquire(c) < target) {
    }
    const unsigned got = __ldcg(&data[(p % 2) * B + (blockIdx.x + 1) % B]);
    if (got != static_cast<unsigned>(p)) atomicAdd(errors, 1u);
  }
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int B = prop.multiProcessorCount;
  printf("%s, %d SMs; %d phases, %d blocks a phase\n", prop.name, B, kPhases, B);
  unsigned *data, *counters, *errors;
  CK(cudaMalloc(&data, 2 * B * sizeof(unsigned)));
  CK(cudaMalloc(&counters, kPhases * sizeof(unsigned)));
  CK(cudaMalloc(&errors, sizeof(unsigned)));
  CK(cudaMemset(errors, 0, sizeof(unsigned)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto median_of = [&](auto&& launch) {
    for (int i = 0; i < 20; ++i) launch();
    std::vector<float> ts;
    for (int i = 0; i < 200; ++i) {
      CK(cudaEventRecord(e0, s));
      launch();
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
  };
  auto report = [&](const char* name, float ms) {
    unsigned err = 0;
    CK(cudaMemcpy(&err, errors, sizeof err, cudaMemcpyDeviceToHost));
    printf("%-62s %8.1f us total %6.2f us a phase  %s\n", name, ms * 1000, ms * 1000 / kPhases,
           err ? "DATA ERRORS" : "data ok");
    CK(cudaMemset(errors, 0, sizeof(unsigned)));
    return err == 0;
  };
  bool ok = true;
  for (int round = 0; round < 2; ++round) {
    printf("round %d\n", round + 1);
    for (bool pdl : {true, false}) {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      for (int p = 0; p < kPhases; ++p) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3(B);
        cfg.blockDim = dim3(32);
        cfg.stream = s;
        cfg.attrs = pdl ? attr : nullptr;
        cfg.numAttrs = pdl ? 1 : 0;
        if (pdl)
          CK(cudaLaunchKernelEx(&cfg, phase_kernel<true>, data, p, errors));
        else
          CK(cudaLaunchKernelEx(&cfg, phase_kernel<false>, data, p, errors));
      }
      CK(cudaStreamEndCapture(s, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      const float ms = median_of([&] { CK(cudaGraphLaunch(ge, s)); });
      ok = report(pdl ? "kernels: one a phase, programmatic dependent launch, graph"
                      : "kernels: one a phase, stream order, graph",
                  ms) && ok;
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
    auto run_counter = [&](auto kernel, const char* name) {
      const float ms = median_of([&] {
        CK(cudaMemsetAsync(counters, 0, kPhases * sizeof(unsigned), s));
        kernel<<<B, 32, 0, s>>>(data, counters, errors);
      });
      // the memset is inside the timed span: time it alone and take it off
      const float memset_ms = median_of([&] { CK(cudaMemsetAsync(counters, 0, kPhases * sizeof(unsigned), s)); });
      return report(name, ms - memset_ms);
    };
    ok = run_counter(counter_kernel<false, false>, "counter: red.release + ld.acquire, one counter") && ok;
    ok = run_counter(counter_kernel<false, true>, "counter: red.release + ld.acquire, a counter a phase") && ok;
    ok = run_counter(counter_kernel<true, false>, "counter: __threadfence + atomicAdd, one counter") && ok;
    ok = run_counter(counter_kernel<true, true>, "counter: __threadfence + atomicAdd, a counter a phase") && ok;
  }
  // An empty launch for reference: the cost of one kernel on its own.
  const float single = median_of([&] { phase_kernel<false><<<B, 32, 0, s>>>(data, 0, errors); });
  printf("%-62s %8.1f us\n", "one kernel launch alone (stream, no graph)", single * 1000);
  printf("%s\n", ok ? "all variants: data ok" : "DATA ERRORS");
  return ok ? 0 : 1;
}
