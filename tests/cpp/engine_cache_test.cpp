// The shared-engine cache key and its failure path, without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/bytes_keyed_cache.h"
#include "runtime/engine_cache.h"

namespace {

TEST(EngineCache, HashIsStableAndSeesEveryByte) {
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  const uint64_t h = kiln::runtime::hash_bytes(data.data(), data.size());
  EXPECT_EQ(h, kiln::runtime::hash_bytes(data.data(), data.size()));
  for (size_t i : {0u, 31u, 32u, 500u, 995u, 999u}) {  // lanes, tail words, last bytes
    data[i] ^= 1;
    EXPECT_NE(h, kiln::runtime::hash_bytes(data.data(), data.size())) << "byte " << i;
    data[i] ^= 1;
  }
  // Length matters even when the extra bytes are zero.
  std::vector<uint8_t> zeros(16, 0);
  EXPECT_NE(kiln::runtime::hash_bytes(zeros.data(), 8), kiln::runtime::hash_bytes(zeros.data(), 16));
  EXPECT_NE(kiln::runtime::hash_bytes(zeros.data(), 0), kiln::runtime::hash_bytes(zeros.data(), 1));
}

TEST(EngineCache, BadBytesFailWithoutCaching) {
  const uint8_t junk[64] = {1, 2, 3};
  kiln::runtime::EngineLoadStats stats;
  auto r = kiln::runtime::load_engine_shared(junk, sizeof(junk), 0, 0, true, nullptr, &stats);
  EXPECT_FALSE(r.is_ok());  // corrupt data (or no GPU): a Status, never a crash
  EXPECT_FALSE(stats.shared);
  EXPECT_EQ(kiln::runtime::shared_engine_count(), 0u);
}

// The sharing logic with the key forced equal: different bytes under one
// (device, hash, size, options) key must load separately; identical bytes share.
using StringCache = kiln::runtime::BytesKeyedCache<std::string>;

kiln::Result<std::shared_ptr<std::string>> load_string(const std::string& bytes, int* loads) {
  ++*loads;
  return std::make_shared<std::string>(bytes);
}

TEST(EngineCache, SameKeyDifferentBytesDoNotShare) {
  StringCache cache;
  const std::string a(64, 'a'), b = std::string(63, 'a') + "b";  // same size, last byte differs
  const kiln::runtime::BytesKey key{0, /*forced hash=*/42, a.size(), 0};
  int loads = 0;
  StringCache::Lookup lookup;

  auto first = cache.get_or_load(key, a.data(), a.size(), [&] { return load_string(a, &loads); },
                                 &lookup);
  ASSERT_TRUE(first.is_ok());
  EXPECT_FALSE(lookup.shared);
  EXPECT_FALSE(lookup.collided);

  auto second = cache.get_or_load(key, b.data(), b.size(), [&] { return load_string(b, &loads); },
                                  &lookup);
  ASSERT_TRUE(second.is_ok());
  EXPECT_FALSE(lookup.shared) << "different bytes must never share a value";
  EXPECT_TRUE(lookup.collided);
  EXPECT_EQ(loads, 2);
  EXPECT_NE(first.value().get(), second.value().get());
  EXPECT_EQ(*second.value(), b);
  EXPECT_EQ(cache.live_count(), 2u);

  // Identical bytes (another buffer) share with the matching entry, whichever came first.
  const std::string b_copy = b;
  auto third = cache.get_or_load(key, b_copy.data(), b_copy.size(),
                                 [&] { return load_string(b_copy, &loads); }, &lookup);
  ASSERT_TRUE(third.is_ok());
  EXPECT_TRUE(lookup.shared);
  EXPECT_EQ(third.value().get(), second.value().get());
  const std::string a_copy = a;
  auto fourth = cache.get_or_load(key, a_copy.data(), a_copy.size(),
                                  [&] { return load_string(a_copy, &loads); }, &lookup);
  ASSERT_TRUE(fourth.is_ok());
  EXPECT_TRUE(lookup.shared);
  EXPECT_EQ(fourth.value().get(), first.value().get());
  EXPECT_EQ(loads, 2);
}

TEST(EngineCache, ValueAndSourceCopyFreedWithLastReference) {
  StringCache cache;
  const std::string a(1000, 'x');
  const kiln::runtime::BytesKey key{0, 7, a.size(), 0};
  int loads = 0;
  std::weak_ptr<const std::string> watch;
  {
    auto r = cache.get_or_load(key, a.data(), a.size(), [&] { return load_string(a, &loads); },
                               nullptr);
    ASSERT_TRUE(r.is_ok());
    watch = r.value();
    EXPECT_EQ(cache.live_count(), 1u);
  }
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(cache.live_count(), 0u);
  // Gone means loaded again, not resurrected.
  auto again = cache.get_or_load(key, a.data(), a.size(), [&] { return load_string(a, &loads); },
                                 nullptr);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(loads, 2);
}

TEST(EngineCache, FailedLoadPublishesNothing) {
  StringCache cache;
  const std::string a(16, 'q');
  const kiln::runtime::BytesKey key{0, 1, a.size(), 0};
  auto r = cache.get_or_load(
      key, a.data(), a.size(),
      [] {
        return kiln::Result<std::shared_ptr<std::string>>(
            kiln::make_status(kiln::StatusCode::kCorruptData, "bad"));
      },
      nullptr);
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(cache.live_count(), 0u);
}

}  // namespace
