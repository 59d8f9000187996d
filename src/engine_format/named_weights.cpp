// hash_bytes and externalize_weights (engine_format.h): naming weights by
// their content so they can live outside the engine, in ExecuTorch named data,
// and be stored and uploaded once however many engines use them.
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "engine_format/engine_format.h"

namespace kiln::engine {
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

Result<std::vector<std::vector<uint8_t>>> externalize_weights(EngineDesc* desc,
                                                              const std::string& key_prefix) {
  if (key_prefix.empty())
    return make_status(StatusCode::kInvalidArgument, "externalize_weights: empty key prefix");
  KILN_RETURN_IF_ERROR(validate_engine(*desc).with_context("externalize_weights"));
  std::vector<std::vector<uint8_t>> out(desc->named_weights.size());
  // Content -> named weight index. The key holds the hash and the size; two
  // contents with the same key (a 64-bit collision inside one engine) are
  // refused rather than stored under one name.
  std::map<std::string, uint32_t> by_key;
  for (uint32_t i = 0; i < desc->named_weights.size(); ++i) by_key[desc->named_weights[i].key] = i;
  for (TensorDesc& t : desc->tensors) {
    if (t.storage != StorageKind::kWeight) continue;
    const uint8_t* bytes = desc->weights.data() + t.offset;  // validated range
    const uint64_t hash = hash_bytes(bytes, t.nbytes);
    char suffix[40];
    std::snprintf(suffix, sizeof(suffix), "%016llx-%llu", static_cast<unsigned long long>(hash),
                  static_cast<unsigned long long>(t.nbytes));
    std::string key = key_prefix + suffix;
    auto [it, fresh] = by_key.try_emplace(key, static_cast<uint32_t>(desc->named_weights.size()));
    if (fresh) {
      desc->named_weights.push_back(NamedWeight{key, t.nbytes, hash});
      out.emplace_back(bytes, bytes + t.nbytes);
    } else if (it->second < out.size() && !out[it->second].empty() &&
               (out[it->second].size() != t.nbytes ||
                std::memcmp(out[it->second].data(), bytes, t.nbytes) != 0)) {
      return make_status(StatusCode::kInternal,
                         "externalize_weights: tensor '%s' and an earlier weight have the same "
                         "hash but different bytes",
                         t.name.c_str());
    }
    t.storage = StorageKind::kNamedWeight;
    t.io_index = it->second;
    t.offset = 0;
  }
  std::vector<uint8_t>().swap(desc->weights);
  KILN_RETURN_IF_ERROR(validate_engine(*desc).with_context("externalize_weights"));
  return out;
}

std::vector<ExternalWeight> external_weights(const EngineDesc& desc, std::vector<std::vector<uint8_t>> bytes) {
  std::vector<std::string> names(desc.named_weights.size());
  for (const TensorDesc& t : desc.tensors)
    if (t.storage == StorageKind::kNamedWeight && t.io_index < names.size() && names[t.io_index].empty())
      names[t.io_index] = t.name;
  std::vector<ExternalWeight> out;
  for (size_t i = 0; i < bytes.size() && i < names.size(); ++i)
    if (!bytes[i].empty()) out.push_back(ExternalWeight{desc.named_weights[i].key, names[i], std::move(bytes[i])});
  return out;
}

}  // namespace kiln::engine
