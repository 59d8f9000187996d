#include "runtime/state_registry.h"

#include <vector>

namespace kiln::runtime {

Result<StateRegistry::Acquired> StateRegistry::acquire(int device, const std::string& scope,
                                                       const engine::StateDesc& want) {
  if (!want.init.empty() && want.init.size() != want.nbytes)
    return make_status(StatusCode::kInvalidArgument, "state '%s': %zu bytes of initial value for %llu bytes",
                       want.key.c_str(), want.init.size(), static_cast<unsigned long long>(want.nbytes));
  std::lock_guard<std::mutex> lock(mutex_);
  const Id id{device, scope, want.key};
  auto it = entries_.find(id);
  if (it != entries_.end()) {
    if (std::shared_ptr<DeviceState> live = it->second.lock()) {
      if (live->nbytes() != want.nbytes)
        return make_status(StatusCode::kInvalidArgument,
                           "state '%s' is %llu bytes in this engine but %llu bytes in one already loaded "
                           "in scope '%s' on GPU %d (two models exported with one model id? give "
                           "them different ids, or load them in different state scopes)",
                           want.key.c_str(), static_cast<unsigned long long>(want.nbytes),
                           static_cast<unsigned long long>(live->nbytes()), scope.c_str(), device);
      return Acquired{std::move(live), true};
    }
  }
  // Zeros unless the export recorded a value (a buffer registered non-zero).
  std::vector<uint8_t> zeros;
  const void* init = want.init.data();
  if (want.init.empty()) {
    zeros.assign(want.nbytes, 0);
    init = zeros.data();
  }
  KILN_ASSIGN_OR_RETURN(void* data, ops_->upload(device, init, want.nbytes));
  auto state = std::make_shared<DeviceState>(ops_, device, want.key, data, want.nbytes);
  entries_[id] = state;
  for (auto e = entries_.begin(); e != entries_.end();)
    e = e->second.expired() ? entries_.erase(e) : std::next(e);
  return Acquired{std::move(state), false};
}

size_t StateRegistry::live_count() {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& e : entries_) n += e.second.expired() ? 0 : 1;
  return n;
}

}  // namespace kiln::runtime
