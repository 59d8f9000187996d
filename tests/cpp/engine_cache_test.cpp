// The shared-engine cache key and its failure path, without a GPU.
#include <gtest/gtest.h>

#include <vector>

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
  auto r = kiln::runtime::load_engine_shared(junk, sizeof(junk), 0, 0, true, &stats);
  EXPECT_FALSE(r.is_ok());  // corrupt data (or no GPU): a Status, never a crash
  EXPECT_FALSE(stats.shared);
  EXPECT_EQ(kiln::runtime::shared_engine_count(), 0u);
}

}  // namespace
