// What binds the persistent decode kernel's products (docs/design_llm.md item 18): the shared-memory
// reads, the instruction issue, or the latency of 2 warps a scheduler? One block an SM holds 12 staged
// 16 KB weight stages (8 rows x 1024 bf16, the kernel's stage) in shared memory; its 8 consumer warps
// compute each stage's 8 rows against a 1024-long x held in registers (warp w takes row w, lane l the
// 16-byte chunks l + 32j, as the kernel's rows_dot), two stages a call, over and over, and clock64()
// gives the cycles a stage. Variants:
//   fma    the kernel's rows_dot: 8 bf16 unpacked and 8 FMAs a 16-byte chunk (x in fp32)
//   mma    the same rows by mma.sync.m16n8k16 (bf16, fp32 accumulation): lane group g = l / 4 is the
//          mma's column g and row g, so each lane's own x and weights meet on D's diagonal; 2 mmas a
//          chunk instead of 16 unpacks and FMAs (x rounded to bf16, as PyTorch's linear input is)
//   load   the chunks read and XORed, nothing computed: the shared-memory floor
//   alu    the fma variant's arithmetic on register data, no shared-memory reads: the issue floor
// each alone and with the block's 9th warp bulk-copying 16 KB stages into two spare slots all along
// (2 copies in flight, as the kernel's producer), whose writes share the banks: paced at one copy
// every 450 ns (an SM's share of the H200's 4.8 TB/s is 36 KB a microsecond) and flat out (the
// sources are L2-resident, so flat out writes faster than the kernel's stream ever does).
// Checked: fma against a host reference with fp32 x (1e-5 norm-relative), mma against one with x
// rounded to bf16 (1e-5), every stage of every block.
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/sd benchmarks/micro/stage_dot.cu && /tmp/sd
#include <cmath>
#include <cstring>

#include "micro_util.cuh"

namespace {

constexpr int kHidden = 1024, kRows = 8, kStageElems = kRows * kHidden, kStageBytes = 2 * kStageElems;
constexpr int kStages = 12, kSpare = 2, kConsumers = 8, kThreads = 32 * (kConsumers + 1);
constexpr size_t kSmem = (size_t)(kStages + kSpare) * kStageBytes + 64;
enum Variant { kFma, kMma, kLoad, kAlu };
const char* const kNames[] = {"fma", "mma", "load", "alu"};

__device__ __forceinline__ float2 pair(unsigned w) {  // two bf16, low first
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
// D += A * B for one m16n8k16 tile; A's rows 8-15 are zero.
__device__ __forceinline__ void mma(float (&c)[4], unsigned a_lo, unsigned a_hi, unsigned b_lo, unsigned b_hi) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a_lo), "r"(0u), "r"(a_hi), "r"(0u), "r"(b_lo), "r"(b_hi));
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rows `row` of stages s0 and s1 against x: out[0], out[1] (every lane holds them).
template <int V>
__device__ __forceinline__ void dot2(const uint4* s0, const uint4* s1, const float (&xr)[32], const unsigned (&xb)[16],
                                     int lane, unsigned salt, float (&out)[2]) {
  const uint4* rows[2] = {s0, s1};
  if (V == kMma) {
    float c[2][4] = {};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const uint4 w = rows[n][lane + 32 * j];
        mma(c[n], xb[4 * j], xb[4 * j + 1], w.x, w.y);
        mma(c[n], xb[4 * j + 2], xb[4 * j + 3], w.z, w.w);
      }
    // D[g][g] = the dot of lane group g's own chunks: lane 4g + g/2 holds it in c[g % 2].
    const int g = lane >> 2;
    const bool diag = (lane & 3) == (g >> 1);
#pragma unroll
    for (int n = 0; n < 2; ++n) out[n] = warp_sum(diag ? ((g & 1) ? c[n][1] : c[n][0]) : 0.f);  // no dynamic index: c stays in registers
    return;
  }
  if (V == kLoad) {
    unsigned a[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const uint4 w = rows[n][lane + 32 * j];
        a[n] ^= w.x ^ w.y ^ w.z ^ w.w;
      }
#pragma unroll
    for (int n = 0; n < 2; ++n) out[n] = __uint_as_float(a[n] & 0x3fffffffu);
    return;
  }
  float s[2][2] = {};
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const uint4 w = V == kAlu ? make_uint4(salt ^ (lane + 32 * j), salt + n, salt * 3u + j, salt ^ 0x3f80u)
                                : rows[n][lane + 32 * j];
      const unsigned e[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = pair(e[q]);
        s[n][j & 1] = fmaf(f.x, xr[8 * j + 2 * q], fmaf(f.y, xr[8 * j + 2 * q + 1], s[n][j & 1]));
      }
    }
#pragma unroll
  for (int n = 0; n < 2; ++n) out[n] = warp_sum(s[n][0] + s[n][1]);
}

// Block b's stages are w + b * kStages * kStageElems; out[b][stage][row]; cycles[b][warp] per stage.
template <int V>
__global__ void __launch_bounds__(kThreads, 1)
    stage_dot(const __nv_bfloat16* w, const float* x, float* out, float* cycles, int reps, int tma, int gap_ns) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint4* ring = reinterpret_cast<uint4*>(smem);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + (size_t)(kStages + kSpare) * kStageBytes);
  volatile unsigned* done = reinterpret_cast<volatile unsigned*>(bars + kSpare);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, b = blockIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(w + (size_t)b * kStages * kStageElems);
  for (int i = tid; i < kStages * kStageBytes / 16; i += kThreads) ring[i] = src[i];
  if (tid == 0) {
    for (int k = 0; k < kSpare; ++k) mbar_init(&bars[k], 1);
    *done = 0;
  }
  __syncthreads();
  if (warp == kConsumers) {  // the producer: 16 KB copies into the spare slots, 2 in flight, until the consumers end
    if (lane == 0 && tma) {
      unsigned phase[kSpare] = {}, i = 0;
      for (; *done == 0; ++i) {
        const int k = i % kSpare;
        if (i >= kSpare) {
          mbar_wait(&bars[k], phase[k]);
          phase[k] ^= 1u;
        }
        mbar_expect_bytes(&bars[k], kStageBytes);
        bulk_load(smem + (size_t)(kStages + k) * kStageBytes, src + (size_t)(i % kStages) * (kStageBytes / 16),
                  kStageBytes, &bars[k]);
        if (gap_ns > 0) __nanosleep(gap_ns);
      }
      for (unsigned k = 0; k < kSpare && k < i; ++k) mbar_wait(&bars[k], phase[k]);  // no copy outlives the block
    }
    return;
  }
  float xr[32];
  unsigned xb[16];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 8; ++e) xr[8 * j + e] = x[8 * (lane + 32 * j) + e];
#pragma unroll
  for (int i = 0; i < 16; ++i) xb[i] = pack_bf16(xr[2 * i], xr[2 * i + 1]);
  asm volatile("bar.sync 1, %0;" ::"n"(32 * kConsumers) : "memory");
  float keep = 0.f;
  const long long t0 = clock64();
  for (int r = 0; r < reps; ++r)
#pragma unroll 1
    for (int s = 0; s < kStages; s += 2) {
      float o[2];
      dot2<V>(ring + (size_t)s * (kStageBytes / 16) + warp * (kHidden / 8),
              ring + (size_t)(s + 1) * (kStageBytes / 16) + warp * (kHidden / 8), xr, xb, lane,
              static_cast<unsigned>(r * 131 + s), o);
      keep += o[0] + o[1];
      if (r == reps - 1 && lane == 0) {
        out[((size_t)b * kStages + s) * kRows + warp] = o[0];
        out[((size_t)b * kStages + s + 1) * kRows + warp] = o[1];
      }
    }
  const long long t1 = clock64();
  asm volatile("bar.sync 1, %0;" ::"n"(32 * kConsumers) : "memory");
  if (tid == 0) *done = 1;
  if (lane == 0) {
    cycles[b * kConsumers + warp] = static_cast<float>(t1 - t0) / (reps * kStages);
    if (keep == 12345.678f) out[0] = keep;  // keeps every rep's work alive
  }
}

template <int V>
void run(int blocks, const __nv_bfloat16* w, const float* x, float* out, float* cycles, int reps, int tma) {
  CK(cudaFuncSetAttribute(stage_dot<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem));
  // tma: 0 none, 1 paced (450 ns between copies), 2 flat out
  stage_dot<V><<<blocks, kThreads, kSmem>>>(w, x, out, cycles, reps, tma > 0, tma == 1 ? 450 : 0);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
}

float bf16_round(float f) {  // round to nearest even, as cvt.rn.bf16x2.f32
  unsigned u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const int blocks = prop.multiProcessorCount;
  int clock_khz = 0;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  std::printf("%s, %d SMs, %.2f GHz (reported); %d stages of 16 KB a block, %d consumer warps\n", prop.name, blocks,
              clock_khz / 1e6, kStages, kConsumers);
  const size_t welems = (size_t)blocks * kStages * kStageElems;
  __nv_bfloat16* w;
  float *x, *out, *cycles;
  CK(cudaMalloc(&w, welems * 2));
  CK(cudaMalloc(&x, kHidden * 4));
  CK(cudaMalloc(&out, (size_t)blocks * kStages * kRows * 4));
  CK(cudaMalloc(&cycles, (size_t)blocks * kConsumers * 4));
  fill_uniform_bf16<<<1024, 256>>>(w, welems, 20261207u, 0.05f);
  std::vector<float> hx(kHidden);
  for (int i = 0; i < kHidden; ++i) hx[i] = std::sin(0.37f * i + 1.f) * 2.f;  // not rounded to bf16 already
  CK(cudaMemcpy(x, hx.data(), kHidden * 4, cudaMemcpyHostToDevice));
  std::vector<__nv_bfloat16> hw(welems);
  CK(cudaMemcpy(hw.data(), w, welems * 2, cudaMemcpyDeviceToHost));
  // References: every stage's rows, x in fp32 and x rounded to bf16.
  const size_t nout = (size_t)blocks * kStages * kRows;
  std::vector<double> ref32(nout), ref16(nout);
  for (size_t r = 0; r < nout; ++r) {
    double a = 0, c = 0;
    for (int k = 0; k < kHidden; ++k) {
      const double wv = __bfloat162float(hw[r * kHidden + k]);
      a += wv * hx[k];
      c += wv * bf16_round(hx[k]);
    }
    ref32[r] = a, ref16[r] = c;
  }
  std::vector<float> hout(nout), hcyc((size_t)blocks * kConsumers);
  bool ok = true;
  auto check = [&](int v, int tma) {
    CK(cudaMemcpy(hout.data(), out, nout * 4, cudaMemcpyDeviceToHost));
    const std::vector<double>& ref = v == kMma ? ref16 : ref32;
    double num = 0, den = 0;
    for (size_t r = 0; r < nout; ++r) num += (hout[r] - ref[r]) * (hout[r] - ref[r]), den += ref[r] * ref[r];
    const double err = std::sqrt(num / den);
    const bool good = err < 1e-5;
    ok &= good;
    std::printf("check %s%s: norm-relative %.2e against the %s reference %s\n", kNames[v], tma ? " + copies" : "", err,
                v == kMma ? "bf16-x" : "fp32-x", good ? "ok" : "<-- WRONG");
  };
  auto timed = [&](int v, int tma) {
    const int reps = 256;
    switch (v) {
      case kFma: run<kFma>(blocks, w, x, out, cycles, reps, tma); break;
      case kMma: run<kMma>(blocks, w, x, out, cycles, reps, tma); break;
      case kLoad: run<kLoad>(blocks, w, x, out, cycles, reps, tma); break;
      default: run<kAlu>(blocks, w, x, out, cycles, reps, tma); break;
    }
    CK(cudaMemcpy(hcyc.data(), cycles, hcyc.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<float> c = hcyc;
    std::sort(c.begin(), c.end());
    const float med = c[c.size() / 2], hi = c.back();
    const char* const modes[] = {"alone", "+copies paced", "+copies flat out"};
    std::printf("%-5s %-16s: %6.1f cycles a 16 KB stage (median over warps; max %.1f), %.1f B a cycle an SM\n",
                kNames[v], modes[tma], med, hi, kStageBytes / med);
  };
  for (int tma : {0, 2})
    for (int v : {kFma, kMma}) {
      timed(v, tma);
      check(v, tma);
    }
  for (int round = 0; round < 2; ++round)
    for (int tma : {0, 1, 2})
      for (int v : {kFma, kMma, kLoad, kAlu}) timed(v, tma);
  std::printf("%s\n", ok ? "numerics: ok" : "numerics: WRONG");
  return ok ? 0 : 2;
}
