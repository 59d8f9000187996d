// The persistent-layers micro-benchmark's model on the host side: its random weights and cache,
// the plain kernel-an-op reference (on its own copy of the cache), the numerics check, and the
// CUDA-event timing. Shapes and reference kernels are in decode_layers_support.cuh.
#pragma once

#include "decode_layers_support.cuh"

template <typename T>
T* alloc(size_t count) {
  T* p = nullptr;
  CK(cudaMalloc(&p, count * sizeof(T)));
  return p;
}

constexpr size_t kDq = (size_t)kHidden * kHidden, kDkv = (size_t)kKvHeads * kHeadDim * kHidden;
constexpr size_t kDgu = (size_t)kInter * kHidden, kCacheElems = (size_t)kLayers * kKvHeads * kMaxLen * kHeadDim;

struct Model {
  __nv_bfloat16 *wq, *wk, *wv, *wo, *wg, *wu, *wd;
  float *g1, *g2;
  __nv_bfloat16 *kc, *vc, *rkc, *rvc;  // the kernel's cache and the reference's copy
  float *cos_tab, *sin_tab, *x0;       // the rotary's [kMaxLen][32] (bf16 values), the token's embedding row
  __nv_bfloat16 *cos_b, *sin_b;        // the same tables as the kernel takes them, [kMaxLen][64] (rotate-half form)
  __nv_bfloat16* x0b;                  // the same row as the kernel takes it (x0 holds bf16 values)
  float *rx, *rx1, *xn, *q, *k, *v, *o, *gt, *up, *hh;  // the reference's activations

  Model() {
    wq = alloc<__nv_bfloat16>(kLayers * kDq);
    wk = alloc<__nv_bfloat16>(kLayers * kDkv);
    wv = alloc<__nv_bfloat16>(kLayers * kDkv);
    wo = alloc<__nv_bfloat16>(kLayers * kDq);
    wg = alloc<__nv_bfloat16>(kLayers * kDgu);
    wu = alloc<__nv_bfloat16>(kLayers * kDgu);
    wd = alloc<__nv_bfloat16>(kLayers * kDgu);
    const float sk = std::sqrt(3.f / kHidden), si = std::sqrt(3.f / kInter);
    fill_uniform_bf16<<<1024, 256>>>(wq, kLayers * kDq, 11u, sk);
    fill_uniform_bf16<<<1024, 256>>>(wk, kLayers * kDkv, 12u, sk);
    fill_uniform_bf16<<<1024, 256>>>(wv, kLayers * kDkv, 13u, sk);
    fill_uniform_bf16<<<1024, 256>>>(wo, kLayers * kDq, 14u, sk);
    fill_uniform_bf16<<<1024, 256>>>(wg, kLayers * kDgu, 15u, sk);
    fill_uniform_bf16<<<1024, 256>>>(wu, kLayers * kDgu, 16u, sk);
    fill_uniform_bf16<<<1024, 256>>>(wd, kLayers * kDgu, 17u, si);
    g1 = alloc<float>(kLayers * kHidden);
    g2 = alloc<float>(kLayers * kHidden);
    fill_f32<<<64, 256>>>(g1, kLayers * kHidden, 21u, 1.f, 0.2f);
    fill_f32<<<64, 256>>>(g2, kLayers * kHidden, 22u, 1.f, 0.2f);
    round_bf16_values<<<64, 256>>>(g1, kLayers * kHidden);  // the kernel reads them as bf16
    round_bf16_values<<<64, 256>>>(g2, kLayers * kHidden);
    kc = alloc<__nv_bfloat16>(kCacheElems);
    vc = alloc<__nv_bfloat16>(kCacheElems);
    rkc = alloc<__nv_bfloat16>(kCacheElems);
    rvc = alloc<__nv_bfloat16>(kCacheElems);
    fill_uniform_bf16<<<1024, 256>>>(kc, kCacheElems, 31u, 1.7f);
    fill_uniform_bf16<<<1024, 256>>>(vc, kCacheElems, 32u, 1.7f);
    CK(cudaMemcpy(rkc, kc, kCacheElems * 2, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(rvc, vc, kCacheElems * 2, cudaMemcpyDeviceToDevice));
    std::vector<float> cs(kMaxLen * 32), sn(kMaxLen * 32);
    std::vector<__nv_bfloat16> csb(kMaxLen * 64), snb(kMaxLen * 64);
    for (int p = 0; p < kMaxLen; ++p)
      for (int i = 0; i < 32; ++i) {
        const double ang = p * std::pow(10000.0, -2.0 * i / kHeadDim);
        const __nv_bfloat16 c = __float2bfloat16(static_cast<float>(std::cos(ang)));
        const __nv_bfloat16 n = __float2bfloat16(static_cast<float>(std::sin(ang)));
        cs[32 * p + i] = __bfloat162float(c);
        sn[32 * p + i] = __bfloat162float(n);
        csb[64 * p + i] = csb[64 * p + i + 32] = c;
        snb[64 * p + i] = snb[64 * p + i + 32] = n;
      }
    cos_tab = alloc<float>(kMaxLen * 32);
    sin_tab = alloc<float>(kMaxLen * 32);
    cos_b = alloc<__nv_bfloat16>(kMaxLen * 64);
    sin_b = alloc<__nv_bfloat16>(kMaxLen * 64);
    CK(cudaMemcpy(cos_tab, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sin_tab, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(cos_b, csb.data(), csb.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sin_b, snb.data(), snb.size() * 2, cudaMemcpyHostToDevice));
    x0 = alloc<float>(kHidden);
    CK(cudaMemcpy(cos_tab, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(sin_tab, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
    fill_f32<<<4, 256>>>(x0, kHidden, 41u, 0.f, 1.7f);
    round_bf16_values<<<4, 256>>>(x0, kHidden);
    x0b = alloc<__nv_bfloat16>(kHidden);
    to_bf16<<<4, 256>>>(x0, kHidden, x0b);
    rx = alloc<float>(kHidden);
    rx1 = alloc<float>(kHidden);
    xn = alloc<float>(kHidden);
    q = alloc<float>(kHidden);
    k = alloc<float>(512);
    v = alloc<float>(512);
    o = alloc<float>(kHidden);
    gt = alloc<float>(kInter);
    up = alloc<float>(kInter);
    hh = alloc<float>(kInter);
    CK(cudaGetLastError());
  }
  Weights weights() const { return {wq, wk, wv, wo, wg, wu, wd, g1, g2}; }

  // The first `layers` layers at position P as plain kernels, one an op; the result is in rx.
  void reference(cudaStream_t stream, int layers, int P) {
    CK(cudaMemcpyAsync(rx, x0, kHidden * 4, cudaMemcpyDeviceToDevice, stream));
    for (int l = 0; l < layers; ++l) {
      ref_norm<<<1, 256, 0, stream>>>(rx, g1 + l * kHidden, xn);
      ref_gemv<<<kHidden / 4, 128, 0, stream>>>(wq + l * kDq, xn, q, kHidden, kHidden, nullptr);
      ref_gemv<<<512 / 4, 128, 0, stream>>>(wk + l * kDkv, xn, k, 512, kHidden, nullptr);
      ref_gemv<<<512 / 4, 128, 0, stream>>>(wv + l * kDkv, xn, v, 512, kHidden, nullptr);
      ref_rotary_cache<<<kHeads + kKvHeads, 32, 0, stream>>>(q, k, v, cos_tab, sin_tab, rkc, rvc, l, P);
      ref_attention<<<kHeads, kHeadDim, 0, stream>>>(q, rkc, rvc, l, P, o);
      ref_gemv<<<kHidden / 4, 128, 0, stream>>>(wo + l * kDq, o, rx1, kHidden, kHidden, rx);
      ref_norm<<<1, 256, 0, stream>>>(rx1, g2 + l * kHidden, xn);
      ref_gemv<<<kInter / 4, 128, 0, stream>>>(wg + l * kDgu, xn, gt, kInter, kHidden, nullptr);
      ref_gemv<<<kInter / 4, 128, 0, stream>>>(wu + l * kDgu, xn, up, kInter, kHidden, nullptr);
      ref_silu_mul<<<kInter / 256, 256, 0, stream>>>(gt, up, hh);
      ref_gemv<<<kHidden / 4, 128, 0, stream>>>(wd + l * kDgu, hh, rx, kHidden, kInter, rx1);
    }
    CK(cudaGetLastError());
  }

  // The kernel's residual row after `layers` layers against the reference's, and the cache rows
  // both wrote at P in the last layer (every kv head, k after rotary, v); prints one line.
  bool check(const float* row, int layers, int P, const char* what) const {
    std::vector<float> got(kHidden), want(kHidden);
    CK(cudaMemcpy(got.data(), row, kHidden * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(want.data(), rx, kHidden * 4, cudaMemcpyDeviceToHost));
    double d = 0, n = 0;
    for (int i = 0; i < kHidden; ++i) {
      d += (double)(got[i] - want[i]) * (got[i] - want[i]);
      n += (double)want[i] * want[i];
    }
    const double r = std::sqrt(d / std::max(n, 1e-30));
    std::vector<__nv_bfloat16> gk(kHeadDim), wk2(kHeadDim);
    double kd = 0, kn = 0;
    for (int which = 0; which < 2; ++which)
      for (int gg = 0; gg < kKvHeads; ++gg) {
        const size_t off = (((size_t)(layers - 1) * kKvHeads + gg) * kMaxLen + P) * kHeadDim;
        CK(cudaMemcpy(gk.data(), (which ? vc : kc) + off, kHeadDim * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(wk2.data(), (which ? rvc : rkc) + off, kHeadDim * 2, cudaMemcpyDeviceToHost));
        for (int e = 0; e < kHeadDim; ++e) {
          const double a = __bfloat162float(gk[e]), b = __bfloat162float(wk2[e]);
          kd += (a - b) * (a - b);
          kn += b * b;
        }
      }
    const double kr = std::sqrt(kd / std::max(kn, 1e-30));
    // One layer: fp32 sums in two orders. 24 layers: both sides round k and v to bf16 (the cache's
    // dtype), and a near-tie rounding apart moves a cached value by one bf16 step (2^-8); that
    // carries through the later layers, most where the attention is one row (position 0: 1.6e-3
    // on an H100), so the limit is bf16's.
    const double lim = layers == 1 ? 1e-4 : 1e-2;
    const bool pass = r < lim && kr < 1e-2;
    std::printf("check after %d layer(s) at position %d, %s: residual norm-relative %.2e (limit %.0e), cache rows %.2e, |ref| %.3g %s\n",
                layers, P, what, r, lim, kr, std::sqrt(n), pass ? "ok" : "<-- WRONG");
    return pass;
  }
};

// The first `layers` layers' weights packed into the kernel's stages and norm region (pack() in
// decode_layers_support.cuh): a second copy of them, as a load-time repack would make; the copy
// does not depend on the grid.
inline __nv_bfloat16* pack_weights(const Weights& wt, int layers) {
  __nv_bfloat16* packed = alloc<__nv_bfloat16>((size_t)layers * kStagesPerLayer * kStageElems + (size_t)layers * 2 * kHidden);
  pack<<<4096, 256>>>(wt, layers, packed);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  return packed;
}
