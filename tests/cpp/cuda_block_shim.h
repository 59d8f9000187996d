// cuda_host_shim.h plus what kernels that cooperate within a block need, so
// a generated kernel with warp shuffles, __syncthreads and __shared__ memory
// runs on the CPU: each block's threads are fibers (ucontext) on the calling
// thread, run one at a time until they reach a barrier; __shared__ variables
// are function statics (blocks run one after another, so one copy is one
// block's). A warp shuffle is two warp barriers around an exchange slot. A
// thread that returns counts as arrived at every later barrier, as a CUDA
// thread that has exited does. A barrier nobody can pass (threads waiting at
// different barriers) aborts with a message instead of hanging. Warps run
// one at a time as far as they can (lowest or highest first), which exposes
// a missing __syncthreads between shared-memory reads and later writes.
#pragma once

#include <ucontext.h>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda_host_shim.h"

#define __shared__ static

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
struct alignas(8) uint2 { unsigned int x, y; };

namespace kiln_shim {

enum class State { kReady, kBlockBarrier, kWarpBarrier, kDone };

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  State state = State::kReady;
};

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t scheduler;
  unsigned current = 0;
  std::vector<unsigned long long> exchange;  // one slot per thread, for shuffles (any 8-byte-or-less type)
  void (*body)() = nullptr;     // runs the kernel for threadIdx
};

inline Block& block() {
  static Block b;
  return b;
}

inline void fiber_main() {
  Block& b = block();
  b.body();
  b.fibers[b.current].state = State::kDone;
  swapcontext(&b.fibers[b.current].ctx, &b.scheduler);
}

inline void wait(State s) {
  Block& b = block();
  b.fibers[b.current].state = s;
  swapcontext(&b.fibers[b.current].ctx, &b.scheduler);
}

// The order runnable threads are resumed in. Either way a warp runs on as
// far as it can before any other warp is resumed, so a missing barrier
// (a warp overwriting shared memory another has yet to read) shows up.
enum class Order { kLowWarpFirst, kHighWarpFirst };

inline void resume(Block& b, unsigned t) {
  b.current = t;
  threadIdx = {t, 0, 0};
  swapcontext(&b.scheduler, &b.fibers[t].ctx);
}

// Releases warp `w`'s shuffle barrier when every live thread of it waits
// there; returns whether it did.
inline bool release_warp(Block& b, unsigned w, unsigned threads) {
  bool any = false, ready = true;
  const unsigned end = std::min(threads, w * 32 + 32);
  for (unsigned t = w * 32; t < end; ++t) {
    State s = b.fibers[t].state;
    any |= s == State::kWarpBarrier;
    ready &= s == State::kWarpBarrier || s == State::kDone;
  }
  if (!any || !ready) return false;
  for (unsigned t = w * 32; t < end; ++t)
    if (b.fibers[t].state == State::kWarpBarrier) b.fibers[t].state = State::kReady;
  return true;
}

// Runs every fiber of the block to completion: the first warp in `order`
// with a runnable thread runs (its warp barriers released as soon as they
// can be) until it is stuck at the block barrier or done, then the next;
// the block barrier is released when every live thread waits there.
inline void run_block(unsigned threads, Order order) {
  Block& b = block();
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = b.fibers[t];
    f.state = State::kReady;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
  }
  const unsigned warps = (threads + 31) / 32;
  for (;;) {
    bool progressed = false;
    for (unsigned i = 0; i < warps && !progressed; ++i) {
      const unsigned w = order == Order::kLowWarpFirst ? i : warps - 1 - i;
      const unsigned end = std::min(threads, w * 32 + 32);
      for (;;) {
        bool ran = false;
        for (unsigned t = w * 32; t < end; ++t)
          if (b.fibers[t].state == State::kReady) {
            resume(b, t);
            ran = true;
          }
        if (!ran && !release_warp(b, w, threads)) break;
        progressed = true;
      }
    }
    if (progressed) continue;
    bool all_done = true, block_ready = true;
    for (unsigned t = 0; t < threads; ++t) {
      State s = b.fibers[t].state;
      all_done &= s == State::kDone;
      block_ready &= s == State::kBlockBarrier || s == State::kDone;
    }
    if (all_done) return;
    if (!block_ready) {
      std::fprintf(stderr, "cuda_block_shim: deadlock (threads wait at different barriers)\n");
      std::abort();
    }
    for (unsigned t = 0; t < threads; ++t)
      if (b.fibers[t].state == State::kBlockBarrier) b.fibers[t].state = State::kReady;
  }
}

}  // namespace kiln_shim

inline void __syncthreads() { kiln_shim::wait(kiln_shim::State::kBlockBarrier); }

namespace kiln_shim {
// A warp shuffle: every lane posts `v`, then reads the value of lane
// `source(own lane slot)`; two warp barriers around the exchange.
template <class T, class Source>
inline T exchange(T v, Source source) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "shuffles move at most 8 bytes");
  Block& b = block();
  const unsigned me = b.current;
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  b.exchange[me] = bits;
  wait(State::kWarpBarrier);  // every lane has written
  bits = b.exchange[source(me)];
  wait(State::kWarpBarrier);  // every lane has read
  T other;
  std::memcpy(&other, &bits, sizeof(T));
  return other;
}
}  // namespace kiln_shim

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  return kiln_shim::exchange(v, [&](unsigned me) { return me ^ static_cast<unsigned>(lane_mask); });
}

// Lane `src` of this thread's warp broadcasts `v`.
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  return kiln_shim::exchange(v, [&](unsigned me) { return (me & ~31u) | (static_cast<unsigned>(src) & 31u); });
}

// kiln_shim_launch for cooperating kernels: each block's threads as fibers.
template <class... A>
void kiln_shim_launch_blocks(void (*f)(A...), void** args, unsigned grid, unsigned block_threads,
                             kiln_shim::Order order = kiln_shim::Order::kLowWarpFirst) {
  static void (*kernel)(A...);
  static void** kernel_args;
  kernel = f;
  kernel_args = args;
  kiln_shim::Block& b = kiln_shim::block();
  if (b.fibers.size() < block_threads) b.fibers.resize(block_threads);
  for (auto& fiber : b.fibers)
    if (fiber.stack.empty()) fiber.stack.resize(64 * 1024);
  b.exchange.assign(block_threads, 0ull);
  b.body = [] { kiln_shim_call(kernel, kernel_args, std::index_sequence_for<A...>{}); };
  gridDim = {grid, 1, 1};
  blockDim = {block_threads, 1, 1};
  for (unsigned g = 0; g < grid; ++g) {
    blockIdx = {g, 0, 0};
    kiln_shim::run_block(block_threads, order);
  }
}
