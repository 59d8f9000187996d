// Named weights on the GPU: one device copy per (process, device, key, content),
// shared by every Engine that names it, freed when the last one goes.
//
// An engine may keep its weights outside itself, in the program's named data
// (ExecuTorch NamedDataMap: the .pte's named data or a .ptd file), under keys
// made at export ("kiln/<model id>/<content hash>-<size>", engine_desc.h
// NamedWeight). Engines of several methods (prefill and decode) name the same
// keys, so their weights are stored once in the file and, through this cache,
// uploaded once.
//
// Never a silent wrong answer: the bytes a load is given are checked against
// the size and hash the engine recorded (a .ptd from another export or a
// damaged file is refused, kCorruptData), and a cached copy is reused only
// when its key, size AND hash equal the request. The same key with other
// bytes (two models exported with one model id and a colliding content hash,
// or a crafted file) gets a private upload and is counted as a mismatch.
//
// No CUDA types: device memory goes through a DeviceMemoryOps, so the logic is
// tested without a GPU (tests/cpp/named_weight_cache_test.cpp). The process
// cache (process_named_weight_cache) uses cudaMalloc/cudaMemcpy/cudaFree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/status.h"
#include "engine_format/engine_desc.h"

namespace kiln::runtime {

// Allocation and upload of device memory; implementations must be thread-safe.
class DeviceMemoryOps {
 public:
  virtual ~DeviceMemoryOps() = default;
  // Allocates `size` bytes on `device` and copies `host` into them.
  virtual Result<void*> upload(int device, const void* host, size_t size) = 0;
  // Frees what upload returned; errors are ignored (may run at teardown).
  virtual void release(int device, void* data) = 0;
};

// One named weight on one device. Immutable; owned by shared_ptrs held by the
// Engines that use it.
class DeviceWeight {
 public:
  DeviceWeight(DeviceMemoryOps* ops, int device, std::string key, void* data, size_t nbytes,
               uint64_t hash)
      : ops_(ops), device_(device), key_(std::move(key)), data_(data), nbytes_(nbytes),
        hash_(hash) {}
  ~DeviceWeight() {
    if (data_ != nullptr) ops_->release(device_, data_);
  }
  DeviceWeight(const DeviceWeight&) = delete;
  DeviceWeight& operator=(const DeviceWeight&) = delete;

  const void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  uint64_t hash() const { return hash_; }
  int device() const { return device_; }
  const std::string& key() const { return key_; }

 private:
  DeviceMemoryOps* ops_;  // not owned; outlives every DeviceWeight (process lifetime)
  int device_;
  std::string key_;
  void* data_;
  size_t nbytes_;
  uint64_t hash_;
};

struct NamedWeightCounters {
  uint64_t uploads = 0;          // named weights copied to a GPU
  uint64_t uploaded_bytes = 0;
  uint64_t reuses = 0;           // requests served by a copy already on the GPU
  uint64_t reused_bytes = 0;
  uint64_t mismatches = 0;       // same key, other bytes: uploaded privately
};

class NamedWeightCache {
 public:
  explicit NamedWeightCache(DeviceMemoryOps* ops) : ops_(ops) {}

  struct Acquired {
    std::shared_ptr<const DeviceWeight> weight;
    bool reused = false;    // an existing device copy was returned
    bool mismatch = false;  // a live copy had this key but other bytes; not shared
  };

  // The device copy of named weight `want` on `device`, whose bytes the
  // caller read from the program's named data (`bytes`, `size`; only read
  // during the call). Checks size and hash against `want` first
  // (kCorruptData naming the key otherwise), then reuses a live copy with
  // the same key, size and hash, or uploads (with `share` false: always
  // uploads and publishes nothing). Thread-safe; concurrent requests for one
  // key upload once.
  Result<Acquired> acquire(int device, const engine::NamedWeight& want, const void* bytes,
                           size_t size, bool share);

  // Live device copies (expired entries not counted) and the counters so far.
  size_t live_count();
  NamedWeightCounters counters();

 private:
  DeviceMemoryOps* ops_;
  std::mutex mutex_;  // held across an upload: a second loader of the key waits and reuses
  std::multimap<std::pair<int, std::string>, std::weak_ptr<const DeviceWeight>> entries_;
  NamedWeightCounters counters_;
};

// Whether `bytes`/`size` (read from a load's named data under want.key) are
// the weight the engine recorded: kCorruptData naming the key when the size
// or the content hash differs.
Status check_named_weight_bytes(const engine::NamedWeight& want, const void* bytes, size_t size);

// The process's cache over CUDA (cudaMalloc + cudaMemcpy, cudaFree), shared
// by every Engine::load. Leaked on purpose (engines may die at teardown).
NamedWeightCache& process_named_weight_cache();

}  // namespace kiln::runtime
