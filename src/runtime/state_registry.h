// Mutable state on the GPU (engine_desc.h StateDesc: a KV cache), one device
// buffer per (process, device, scope, key), shared by every Engine that names
// it (a program's prefill and decode methods) and freed with the last one.
//
// Unlike named weights, the content changes as the program runs, so sharing
// is by name alone: two loads of one model in the same scope see one cache.
// The scope (a load option of the delegate, "" by default) keeps apart the
// caches of loads that must not share, such as two concurrent generations.
// A state of the same key and scope but another size is refused.
//
// No CUDA types: device memory goes through DeviceMemoryOps
// (named_weight_cache.h), so the logic is tested without a GPU.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "common/status.h"
#include "engine_format/engine_desc.h"
#include "runtime/named_weight_cache.h"

namespace kiln::runtime {

class DeviceState {
 public:
  DeviceState(DeviceMemoryOps* ops, int device, std::string key, void* data, uint64_t nbytes)
      : ops_(ops), device_(device), key_(std::move(key)), data_(data), nbytes_(nbytes) {}
  ~DeviceState() { ops_->release(device_, data_); }
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;

  void* data() const { return data_; }
  uint64_t nbytes() const { return nbytes_; }
  const std::string& key() const { return key_; }

 private:
  DeviceMemoryOps* ops_;
  int device_;
  std::string key_;
  void* data_;
  uint64_t nbytes_;
};

class StateRegistry {
 public:
  explicit StateRegistry(DeviceMemoryOps* ops) : ops_(ops) {}

  struct Acquired {
    std::shared_ptr<DeviceState> state;
    bool reused = false;  // a live buffer of this (device, scope, key) was returned
  };

  // The device buffer of `want` on `device` in `scope`: the live one, or a new
  // one holding want.init (zeros when empty). kInvalidArgument when a live
  // buffer of the key has another size. Thread-safe.
  Result<Acquired> acquire(int device, const std::string& scope, const engine::StateDesc& want);

  size_t live_count();

 private:
  using Id = std::tuple<int, std::string, std::string>;
  DeviceMemoryOps* ops_;
  std::mutex mutex_;
  std::map<Id, std::weak_ptr<DeviceState>> entries_;
};

// The process's registry over CUDA (cudaMalloc + cudaMemcpy, cudaFree).
StateRegistry& process_state_registry();

}  // namespace kiln::runtime
