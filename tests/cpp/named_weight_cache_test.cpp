// The named-weight cache (src/runtime/named_weight_cache.h) without a GPU: a
// fake DeviceMemoryOps stands in for cudaMalloc/cudaMemcpy/cudaFree.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine_format/engine_format.h"
#include "runtime/named_weight_cache.h"
#include "runtime/state_registry.h"

namespace kiln::runtime {
namespace {

// "Device memory" is host memory; uploads, frees and live buffers counted.
class FakeOps : public DeviceMemoryOps {
 public:
  Result<void*> upload(int device, const void* host, size_t size) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fail_next) {
      fail_next = false;
      return make_status(StatusCode::kOutOfMemory, "fake: out of memory");
    }
    void* p = std::malloc(size == 0 ? 1 : size);
    std::memcpy(p, host, size);
    live[p] = device;
    ++uploads;
    return p;
  }
  void release(int device, void* data) override {
    std::lock_guard<std::mutex> lock(mutex_);
    EXPECT_EQ(live.count(data), 1u);
    EXPECT_EQ(live[data], device);
    live.erase(data);
    ++releases;
    std::free(data);
  }
  std::mutex mutex_;
  std::map<void*, int> live;
  int uploads = 0, releases = 0;
  bool fail_next = false;
};

std::vector<uint8_t> bytes_of(uint8_t seed, size_t n = 1000) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return v;
}

engine::NamedWeight want(const std::string& key, const std::vector<uint8_t>& b) {
  return engine::NamedWeight{key, b.size(), engine::hash_bytes(b.data(), b.size())};
}

TEST(NamedWeightCache, SameKeyAndBytesUploadOnceAndShare) {
  FakeOps ops;
  NamedWeightCache cache(&ops);
  const auto w = bytes_of(1);
  auto a = cache.acquire(0, want("kiln/m/w", w), w.data(), w.size(), true);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  EXPECT_FALSE(a.value().reused);
  // A second engine (another method) naming the same weight, from its own
  // copy of the bytes (the named data read again).
  const auto again = w;
  auto b = cache.acquire(0, want("kiln/m/w", again), again.data(), again.size(), true);
  ASSERT_TRUE(b.is_ok());
  EXPECT_TRUE(b.value().reused);
  EXPECT_FALSE(b.value().mismatch);
  EXPECT_EQ(a.value().weight.get(), b.value().weight.get());
  EXPECT_EQ(ops.uploads, 1);
  EXPECT_EQ(std::memcmp(a.value().weight->data(), w.data(), w.size()), 0);
  NamedWeightCounters c = cache.counters();
  EXPECT_EQ(c.uploads, 1u);
  EXPECT_EQ(c.reuses, 1u);
  EXPECT_EQ(c.reused_bytes, w.size());
}

TEST(NamedWeightCache, FreedWithTheLastReference) {
  FakeOps ops;
  NamedWeightCache cache(&ops);
  const auto w = bytes_of(2);
  auto a = cache.acquire(0, want("kiln/m/w", w), w.data(), w.size(), true).value();
  auto b = cache.acquire(0, want("kiln/m/w", w), w.data(), w.size(), true).value();
  EXPECT_EQ(cache.live_count(), 1u);
  a.weight.reset();
  EXPECT_EQ(ops.releases, 0);  // `b` still uses it
  b.weight.reset();
  EXPECT_EQ(ops.releases, 1);
  EXPECT_EQ(cache.live_count(), 0u);
  // Loading again after everything went uploads again.
  auto c = cache.acquire(0, want("kiln/m/w", w), w.data(), w.size(), true).value();
  EXPECT_FALSE(c.reused);
  EXPECT_EQ(ops.uploads, 2);
}

// The seed's silent wrong answer: two models whose weights have the same key
// but different bytes must never share one device copy.
TEST(NamedWeightCache, SameKeyOtherBytesNeverShares) {
  FakeOps ops;
  NamedWeightCache cache(&ops);
  const auto model_a = bytes_of(3), model_b = bytes_of(4);
  auto a = cache.acquire(0, want("kiln/same-id/fc1", model_a), model_a.data(), model_a.size(), true);
  auto b = cache.acquire(0, want("kiln/same-id/fc1", model_b), model_b.data(), model_b.size(), true);
  ASSERT_TRUE(a.is_ok());
  ASSERT_TRUE(b.is_ok());
  EXPECT_FALSE(b.value().reused);
  EXPECT_TRUE(b.value().mismatch);
  EXPECT_NE(a.value().weight.get(), b.value().weight.get());
  EXPECT_EQ(std::memcmp(a.value().weight->data(), model_a.data(), model_a.size()), 0);
  EXPECT_EQ(std::memcmp(b.value().weight->data(), model_b.data(), model_b.size()), 0);
  EXPECT_EQ(cache.counters().mismatches, 1u);
  // The key keeps meaning model A's content: A again shares A's copy, B again
  // gets another private copy, never A's.
  auto a2 = cache.acquire(0, want("kiln/same-id/fc1", model_a), model_a.data(), model_a.size(), true);
  EXPECT_EQ(a2.value().weight.get(), a.value().weight.get());
  auto b2 = cache.acquire(0, want("kiln/same-id/fc1", model_b), model_b.data(), model_b.size(), true);
  EXPECT_NE(b2.value().weight.get(), a.value().weight.get());
  EXPECT_EQ(std::memcmp(b2.value().weight->data(), model_b.data(), model_b.size()), 0);
  // Same size and same first bytes, one byte different at the end.
  auto tweaked = model_a;
  tweaked.back() ^= 1;
  auto t = cache.acquire(0, want("kiln/same-id/fc1", tweaked), tweaked.data(), tweaked.size(), true);
  EXPECT_NE(t.value().weight.get(), a.value().weight.get());
}

TEST(NamedWeightCache, BytesThatDoNotMatchTheEngineAreRefused) {
  FakeOps ops;
  NamedWeightCache cache(&ops);
  const auto expected = bytes_of(5), given = bytes_of(6);
  // A .ptd from another export: right key and size, other bytes.
  auto r = cache.acquire(0, want("kiln/m/w", expected), given.data(), given.size(), true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruptData);
  EXPECT_NE(r.status().message().find("kiln/m/w"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("another export"), std::string::npos);
  // Wrong size.
  r = cache.acquire(0, want("kiln/m/w", expected), expected.data(), expected.size() - 1, true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruptData);
  EXPECT_NE(r.status().message().find("999 bytes"), std::string::npos) << r.status().message();
  EXPECT_EQ(ops.uploads, 0);
}

// The check a load runs when its whole engine is already resident (no
// upload, only the bytes it was given against the engine's record).
TEST(NamedWeightCache, ByteCheckAloneAcceptsOnlyTheRecordedWeight) {
  const auto expected = bytes_of(5), other = bytes_of(6);
  EXPECT_TRUE(check_named_weight_bytes(want("kiln/m/w", expected), expected.data(), expected.size()).is_ok());
  Status s = check_named_weight_bytes(want("kiln/m/w", expected), other.data(), other.size());
  EXPECT_EQ(s.code(), StatusCode::kCorruptData);
  EXPECT_NE(s.message().find("kiln/m/w"), std::string::npos) << s.message();
  s = check_named_weight_bytes(want("kiln/m/w", expected), expected.data(), 10);
  EXPECT_EQ(s.code(), StatusCode::kCorruptData);
  EXPECT_NE(s.message().find("10 bytes"), std::string::npos) << s.message();
}

TEST(NamedWeightCache, DevicesAndPrivateLoadsAreSeparate) {
  FakeOps ops;
  NamedWeightCache cache(&ops);
  const auto w = bytes_of(7);
  auto d0 = cache.acquire(0, want("kiln/m/w", w), w.data(), w.size(), true).value();
  auto d1 = cache.acquire(1, want("kiln/m/w", w), w.data(), w.size(), true).value();
  EXPECT_FALSE(d1.reused);
  EXPECT_NE(d0.weight.get(), d1.weight.get());
  EXPECT_EQ(d1.weight->device(), 1);
  auto priv = cache.acquire(0, want("kiln/m/w", w), w.data(), w.size(), false).value();
  EXPECT_FALSE(priv.reused);
  EXPECT_NE(priv.weight.get(), d0.weight.get());
  auto shared = cache.acquire(0, want("kiln/m/w", w), w.data(), w.size(), true).value();
  EXPECT_EQ(shared.weight.get(), d0.weight.get());  // the private copy was not published
  EXPECT_EQ(ops.uploads, 3);
}

TEST(NamedWeightCache, FailedUploadIsAnErrorAndCachesNothing) {
  FakeOps ops;
  NamedWeightCache cache(&ops);
  const auto w = bytes_of(8);
  ops.fail_next = true;
  auto r = cache.acquire(0, want("kiln/m/w", w), w.data(), w.size(), true);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(cache.live_count(), 0u);
  auto ok = cache.acquire(0, want("kiln/m/w", w), w.data(), w.size(), true);
  ASSERT_TRUE(ok.is_ok());
  EXPECT_FALSE(ok.value().reused);
}

TEST(NamedWeightCache, ConcurrentLoadsOfOneKeyUploadOnce) {
  FakeOps ops;
  NamedWeightCache cache(&ops);
  const auto w = bytes_of(9, 1 << 16);
  std::vector<std::shared_ptr<const DeviceWeight>> got(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] {
      got[i] = cache.acquire(0, want("kiln/m/w", w), w.data(), w.size(), true).value().weight;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ops.uploads, 1);
  for (const auto& g : got) EXPECT_EQ(g.get(), got[0].get());
}

}  // namespace
// Mutable state: one buffer per (device, scope, key), shared while alive,
// zero-filled or holding the recorded initial value, refused at another size.
TEST(StateRegistry, SharedByKeyZeroFilledAndSizeChecked) {
  FakeOps ops;
  StateRegistry registry(&ops);
  const engine::StateDesc cache{"kiln/m/state/k", 64, {}};
  auto a = registry.acquire(0, "", cache);
  ASSERT_TRUE(a.is_ok());
  EXPECT_FALSE(a.value().reused);
  const auto* bytes = static_cast<const uint8_t*>(a.value().state->data());
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(bytes[i], 0) << i;
  static_cast<uint8_t*>(a.value().state->data())[5] = 7;  // a step wrote it
  auto b = registry.acquire(0, "", cache);  // decode after prefill
  ASSERT_TRUE(b.is_ok());
  EXPECT_TRUE(b.value().reused);
  EXPECT_EQ(b.value().state.get(), a.value().state.get());
  EXPECT_EQ(static_cast<const uint8_t*>(b.value().state->data())[5], 7);
  // Another scope or device: another buffer.
  auto other = registry.acquire(0, "second", cache);
  ASSERT_TRUE(other.is_ok());
  EXPECT_NE(other.value().state.get(), a.value().state.get());
  EXPECT_NE(registry.acquire(1, "", cache).value().state.get(), a.value().state.get());
  // The same key at another size is refused, naming it.
  auto bad = registry.acquire(0, "", engine::StateDesc{"kiln/m/state/k", 128, {}});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("kiln/m/state/k"), std::string::npos) << bad.status().message();
  // A recorded initial value is what a fresh buffer holds.
  std::vector<uint8_t> init(32);
  for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<uint8_t>(i + 1);
  auto v = registry.acquire(0, "", engine::StateDesc{"kiln/m/state/v", 32, init});
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(std::memcmp(v.value().state->data(), init.data(), 32), 0);
  // Freed with the last holder: a later acquire starts fresh (zeros).
  a = Result<StateRegistry::Acquired>(StateRegistry::Acquired{});
  b = Result<StateRegistry::Acquired>(StateRegistry::Acquired{});
  auto again = registry.acquire(0, "", cache);
  ASSERT_TRUE(again.is_ok());
  EXPECT_FALSE(again.value().reused);
  EXPECT_EQ(static_cast<const uint8_t*>(again.value().state->data())[5], 0);
}

}  // namespace kiln::runtime
