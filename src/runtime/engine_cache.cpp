#include "runtime/engine_cache.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "engine_format/engine_format.h"
#include "runtime/bytes_keyed_cache.h"

namespace kiln::runtime {
namespace {

constexpr uint64_t kMul1 = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kMul2 = 0xBF58476D1CE4E5B9ull;
constexpr uint64_t kMul3 = 0x94D049BB133111EBull;

// splitmix64's finalizer: every input bit affects every output bit.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= kMul2;
  x ^= x >> 27;
  x *= kMul3;
  x ^= x >> 31;
  return x;
}

using Cache = BytesKeyedCache<Engine>;

Cache& cache() {
  // Leaked on purpose: contexts may be destroyed during static teardown.
  static Cache* const instance = new Cache();
  return *instance;
}

Result<std::shared_ptr<const Engine>> load_private(const void* bytes, size_t size, int device) {
  KILN_ASSIGN_OR_RETURN(engine::EngineDesc desc, engine::parse_engine(bytes, size));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> loaded, Engine::load(std::move(desc), device));
  return std::shared_ptr<const Engine>(std::move(loaded));
}

}  // namespace

uint64_t hash_bytes(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  // Four independent lanes keep the multiplier pipeline busy (~10 GB/s).
  uint64_t lanes[4] = {kMul1 ^ size, kMul2, kMul3, kMul1 + kMul2};
  size_t i = 0;
  for (; i + 32 <= size; i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      lanes[l] = (lanes[l] ^ w) * kMul1;
      lanes[l] ^= lanes[l] >> 29;
    }
  }
  uint64_t h = mix(lanes[0]) ^ mix(lanes[1] + 1) ^ mix(lanes[2] + 2) ^ mix(lanes[3] + 3);
  for (; i + 8 <= size; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = mix(h ^ w);
  }
  if (i < size) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, size - i);
    h = mix(h ^ w ^ (static_cast<uint64_t>(size - i) << 56));
  }
  return mix(h ^ size);
}

Result<std::shared_ptr<const Engine>> load_engine_shared(const void* bytes, size_t size,
                                                         int device, uint64_t options_key,
                                                         bool share, EngineLoadStats* stats) {
  EngineLoadStats local;
  EngineLoadStats& s = stats != nullptr ? *stats : local;
  s = EngineLoadStats{};
  if (!share) return load_private(bytes, size, device);

  const auto start = std::chrono::steady_clock::now();
  s.hash = hash_bytes(bytes, size);
  s.hash_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const BytesKey key{device, s.hash, size, options_key};
  Cache::Lookup lookup;
  Result<std::shared_ptr<const Engine>> engine = cache().get_or_load(
      key, bytes, size, [&] { return load_private(bytes, size, device); }, &lookup);
  s.shared = lookup.shared;
  s.collided = lookup.collided;
  return engine;
}

size_t shared_engine_count() {
  return cache().live_count();
}

}  // namespace kiln::runtime
