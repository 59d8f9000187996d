#include "runtime/engine_cache.h"

#include <chrono>
#include <cstring>
#include <utility>

#include "engine_format/engine_format.h"
#include "runtime/bytes_keyed_cache.h"
#include "runtime/named_weight_cache.h"

namespace kiln::runtime {
namespace {

using Cache = BytesKeyedCache<Engine>;

Cache& cache() {
  // Leaked on purpose: contexts may be destroyed during static teardown.
  static Cache* const instance = new Cache();
  return *instance;
}

Result<std::shared_ptr<const Engine>> load_private(const void* bytes, size_t size, int device,
                                                   const WeightSource* weights, bool share,
                                                   NamedWeightLoadStats* stats, const std::string& scope) {
  KILN_ASSIGN_OR_RETURN(engine::EngineDesc desc, engine::parse_engine(bytes, size));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> loaded,
                        Engine::load(std::move(desc), device, weights, share, stats, scope));
  return std::shared_ptr<const Engine>(std::move(loaded));
}

// A load that found its whole engine already resident must still bring the
// engine's named weights, as a first load would: a .pte saved with external
// weights and loaded without its .ptd, or with another export's, is refused
// the same way whether or not an identical engine is live in the process.
// The resident device copies are used; the load's bytes are only checked.
Status check_named_data(const Engine& engine, const WeightSource* weights, NamedWeightLoadStats* s) {
  const auto& wanted = engine.desc().named_weights;
  KILN_RETURN_IF_ERROR(require_named_data(wanted, weights));
  for (const engine::NamedWeight& want : wanted) {
    KILN_RETURN_IF_ERROR(weights->read(want.key, [&](const void* data, size_t size) {
      return check_named_weight_bytes(want, data, size);
    }));
    ++s->reused;
    s->reused_bytes += want.nbytes;
  }
  return Status::ok();
}

}  // namespace

Result<std::shared_ptr<const Engine>> load_engine_shared(const void* bytes, size_t size,
                                                         int device, uint64_t options_key,
                                                         bool share, const WeightSource* weights,
                                                         EngineLoadStats* stats, const std::string& state_scope) {
  EngineLoadStats local;
  EngineLoadStats& s = stats != nullptr ? *stats : local;
  s = EngineLoadStats{};
  if (!share) return load_private(bytes, size, device, weights, false, &s.named, state_scope);

  const auto start = std::chrono::steady_clock::now();
  s.hash = hash_bytes(bytes, size);
  s.hash_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // An Engine holds its states: loads in other state scopes never share one.
  if (!state_scope.empty()) options_key ^= hash_bytes(state_scope.data(), state_scope.size()) * 0x9e3779b97f4a7c15ull;
  const BytesKey key{device, s.hash, size, options_key};
  Cache::Lookup lookup;
  Result<std::shared_ptr<const Engine>> engine = cache().get_or_load(
      key, bytes, size, [&] { return load_private(bytes, size, device, weights, true, &s.named, state_scope); },
      &lookup);
  s.shared = lookup.shared;
  s.collided = lookup.collided;
  if (engine.is_ok() && s.shared) KILN_RETURN_IF_ERROR(check_named_data(*engine.value(), weights, &s.named));
  return engine;
}

size_t shared_engine_count() {
  return cache().live_count();
}

}  // namespace kiln::runtime
