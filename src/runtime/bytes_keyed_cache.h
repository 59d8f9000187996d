// The sharing logic of the engine cache (engine_cache.h), generic over what is
// shared so that it is tested without a GPU (tests/cpp/engine_cache_test.cpp).
//
// A value is shared only when its source bytes are IDENTICAL: the key (device,
// 64-bit hash, size, options) finds candidates, then the bytes are compared
// with a copy kept beside the value. Two different byte strings that collide
// on the key are loaded separately (both stay shareable: one key may list
// several entries). Memory cost: one host copy of the source bytes per live
// shared value, freed with the value (it lives in the same allocation as the
// value's owner, not in the map, so an expired entry holds ~80 bytes only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kiln::runtime {

struct BytesKey {
  int device = 0;
  uint64_t hash = 0;
  size_t size = 0;
  uint64_t options = 0;
  bool operator<(const BytesKey& o) const {
    return std::tie(device, hash, size, options) < std::tie(o.device, o.hash, o.size, o.options);
  }
};

template <typename T>
class BytesKeyedCache {
 public:
  struct Lookup {
    bool shared = false;     // an already loaded value was returned
    bool collided = false;   // an entry had the same key but different bytes
  };

  // Returns the live value loaded from bytes identical to `bytes[0, size)`
  // under `key`, or calls `load()` (-> Result<std::shared_ptr<T>>) and
  // publishes what it returns. The lock is held across the load, so
  // concurrent loads of the same bytes end up sharing one value.
  template <typename Load>
  Result<std::shared_ptr<const T>> get_or_load(const BytesKey& key, const void* bytes, size_t size,
                                               Load&& load, Lookup* lookup) {
    Lookup local;
    Lookup& out = lookup != nullptr ? *lookup : local;
    out = Lookup{};
    std::lock_guard<std::mutex> lock(mutex_);
    auto range = entries_.equal_range(key);
    for (auto it = range.first; it != range.second; ++it) {
      std::shared_ptr<const Holder> holder = it->second.lock();
      if (holder == nullptr) continue;
      if (holder->source.size() == size &&
          (size == 0 || std::memcmp(holder->source.data(), bytes, size) == 0)) {
        out.shared = true;
        return std::shared_ptr<const T>(holder, holder->value.get());
      }
      out.collided = true;  // same key, other bytes: never share
    }
    // Copy first: if the copy cannot be made, nothing was loaded yet.
    auto holder = std::make_shared<Holder>();
    holder->source.assign(static_cast<const uint8_t*>(bytes),
                          static_cast<const uint8_t*>(bytes) + size);
    KILN_ASSIGN_OR_RETURN(holder->value, load());
    entries_.emplace(key, std::weak_ptr<const Holder>(holder));
    // Drop entries whose value is gone, so the map does not grow without bound.
    for (auto e = entries_.begin(); e != entries_.end();)
      e = e->second.expired() ? entries_.erase(e) : std::next(e);
    const T* value = holder->value.get();
    return std::shared_ptr<const T>(std::shared_ptr<const Holder>(std::move(holder)), value);
  }

  // Live values (expired entries not counted).
  size_t live_count() {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t n = 0;
    for (const auto& e : entries_) n += e.second.expired() ? 0 : 1;
    return n;
  }

 private:
  // The value and its source bytes, freed together with the last reference.
  struct Holder {
    std::shared_ptr<const T> value;
    std::vector<uint8_t> source;
  };

  std::mutex mutex_;  // held across a whole load: loads are rare, sharing is the point
  std::multimap<BytesKey, std::weak_ptr<const Holder>> entries_;
};

}  // namespace kiln::runtime
