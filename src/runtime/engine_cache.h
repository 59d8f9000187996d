// Process-wide sharing of loaded engines. Loading the same engine bytes twice
// on one device gives the same immutable Engine (weights, kernel modules,
// cuBLASLt plans) instead of a second copy; each caller still makes its own
// ExecutionContext. The cache holds weak_ptrs only, so an Engine is freed
// when its last context goes away, exactly as without the cache.
//
// Sharing needs identical bytes, not only an equal key: the key (device, hash,
// size, options) finds candidates and the bytes are then compared with a host
// copy kept with each shared Engine (bytes_keyed_cache.h). Memory cost: one
// host copy of the engine blob, weights included, per live shared Engine
// (e.g. ~51 MB for an fp16 ResNet-50 with inline weights; named weights are
// not in the blob), freed with the Engine; private loads
// (`share` false) keep none. Time cost on a hit: one memcmp (~10 GB/s).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "engine_format/engine_format.h"
#include "runtime/engine.h"

namespace kiln::runtime {

// engine::hash_bytes (engine_format.h). The cache key pairs it with the size
// and the device; a collision (about 2^-64 per pair of same-length engines, or
// crafted) only costs a second load, since bytes are compared before sharing.
using engine::hash_bytes;

struct EngineLoadStats {
  bool shared = false;        // true when an already loaded Engine was reused
  uint64_t hash = 0;          // hash_bytes of the engine bytes
  double hash_seconds = 0.0;  // time spent hashing
  bool collided = false;      // a cached Engine had the same key but other bytes
  NamedWeightLoadStats named;  // named weights of a fresh load (all zero when `shared`)
};

// Parses and loads the engine in `bytes` onto `device`, or returns the Engine
// already loaded from byte-for-byte identical bytes on that device with the same
// `options_key` (a fingerprint of any load option that changes what Engine
// holds; 0 today, since no option does). With `share` false the Engine is
// private: neither looked up nor published, and its named weights are private
// copies. Thread-safe: concurrent loads of the same bytes are serialized so
// that both end up sharing one Engine. `weights` gives the named weights of
// a fresh load (Engine::load); a reused Engine already holds them, and the
// load's `weights` are still checked against the engine's record (a .pte with
// external weights loaded without its .ptd is refused either way).
// `state_scope` names the StateRegistry scope of the engine's mutable states;
// loads in different scopes never share an Engine.
Result<std::shared_ptr<const Engine>> load_engine_shared(const void* bytes, size_t size,
                                                         int device, uint64_t options_key,
                                                         bool share, const WeightSource* weights,
                                                         EngineLoadStats* stats,
                                                         const std::string& state_scope = "");

// Number of live shared Engines in the cache (expired entries not counted).
size_t shared_engine_count();

}  // namespace kiln::runtime
