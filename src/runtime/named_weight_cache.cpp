#include "runtime/named_weight_cache.h"

#include "engine_format/engine_format.h"

namespace kiln::runtime {

Status check_named_weight_bytes(const engine::NamedWeight& want, const void* bytes, size_t size) {
  if (bytes == nullptr && size != 0)
    return make_status(StatusCode::kInvalidArgument, "named weight '%s': null data",
                       want.key.c_str());
  if (size != want.nbytes)
    return make_status(StatusCode::kCorruptData,
                       "named weight '%s': the program's data holds %zu bytes under this key, "
                       "the engine expects %llu (data from another export? rebuild the .pte and "
                       "its .ptd together)",
                       want.key.c_str(), size, static_cast<unsigned long long>(want.nbytes));
  // The expensive part (~10 GB/s); callers run it outside any lock.
  const uint64_t hash = engine::hash_bytes(bytes, size);
  if (hash != want.hash)
    return make_status(StatusCode::kCorruptData,
                       "named weight '%s': its %zu bytes in the program's data do not match the "
                       "engine (hash %016llx, expected %016llx): the data is damaged or from "
                       "another export",
                       want.key.c_str(), size, static_cast<unsigned long long>(hash),
                       static_cast<unsigned long long>(want.hash));
  return Status::ok();
}

Result<NamedWeightCache::Acquired> NamedWeightCache::acquire(int device,
                                                             const engine::NamedWeight& want,
                                                             const void* bytes, size_t size,
                                                             bool share) {
  KILN_RETURN_IF_ERROR(check_named_weight_bytes(want, bytes, size));
  const uint64_t hash = want.hash;  // checked equal to the bytes' hash

  Acquired out;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto id = std::make_pair(device, want.key);
  if (share) {
    auto range = entries_.equal_range(id);
    for (auto it = range.first; it != range.second; ++it) {
      std::shared_ptr<const DeviceWeight> live = it->second.lock();
      if (live == nullptr) continue;
      if (live->nbytes() == size && live->hash() == hash) {
        out.weight = std::move(live);
        out.reused = true;
        ++counters_.reuses;
        counters_.reused_bytes += size;
        return out;
      }
      out.mismatch = true;  // same key, other content: never share
    }
  }
  KILN_ASSIGN_OR_RETURN(void* data, ops_->upload(device, bytes, size));
  auto weight = std::make_shared<const DeviceWeight>(ops_, device, want.key, data, size, hash);
  ++counters_.uploads;
  counters_.uploaded_bytes += size;
  if (out.mismatch) ++counters_.mismatches;
  // A copy made because of a mismatch is not published: the key keeps
  // meaning the content that was loaded first.
  if (share && !out.mismatch) {
    entries_.emplace(id, std::weak_ptr<const DeviceWeight>(weight));
    for (auto e = entries_.begin(); e != entries_.end();)
      e = e->second.expired() ? entries_.erase(e) : std::next(e);
  }
  out.weight = std::move(weight);
  return out;
}

size_t NamedWeightCache::live_count() {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& e : entries_) n += e.second.expired() ? 0 : 1;
  return n;
}

NamedWeightCounters NamedWeightCache::counters() {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

}  // namespace kiln::runtime
