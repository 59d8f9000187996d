// The serialized engine: what travels inside the .pte as a delegate blob.
//
// Layout (all integers little-endian):
//   FileHeader (fixed size)     magic "KILNENG\0", format version, section
//                               count, total size, header checksum
//   SectionEntry[section_count] kind, offset, size, checksum of the section
//   sections                    each 64-byte aligned
// Every section (weights included) carries a CRC-32C checksum; every offset,
// size, count and index is validated before use, so truncated or flipped
// bytes give a Status naming what is wrong, never a crash.
//
// Runtime code: no exceptions, no aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine_format/engine_desc.h"

namespace kiln::engine {

constexpr char kEngineMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'G', '\0'};
// Bump when the layout changes; the reader refuses other versions with
// kIncompatible (re-export the model with this Kiln). Version 2: batched
// GEMM fields and conv steps. Version 3: each step's payload is preceded by
// its byte size (step kinds register their own codecs, step_format.h).
// Version 4: named weights (a `named_weights` section, storage kind
// kNamedWeight), so weights can live outside the engine and be shared.
// Version 5: mutable state (a `states` section, storage kind kState), kept
// on the device across executions. Version 6: derived weights (a
// `derived_weights` section, storage kind kDerivedWeight: layouts the runtime
// makes at load from the other weights) and KernelStep::min_blocks (persistent
// kernels whose grid is the co-resident block count).
constexpr uint32_t kEngineFormatVersion = 6;

// Serializes `desc`. Fails (kInvalidArgument) when `desc` is inconsistent,
// e.g. an index out of range, so a bad engine is never written.
Result<std::vector<uint8_t>> serialize_engine(const EngineDesc& desc);

// Parses and fully validates `size` bytes at `data`. The result owns copies of
// everything it needs; `data` may be freed afterwards.
Result<EngineDesc> parse_engine(const void* data, size_t size);

// Checks the structure of a parsed or hand-built engine: indices in range,
// tensor sizes consistent with shapes, storage inside the arena/weights.
Status validate_engine(const EngineDesc& desc);

// 64-bit hash of `size` bytes (8 bytes per step, multiply-xorshift mixing;
// ~10 GB/s; not cryptographic). Names the content of a named weight (its key
// and its check at load) and keys the runtime's engine cache.
uint64_t hash_bytes(const void* data, size_t size);

// Moves every inline weight (kWeight tensor) of `desc` out of the engine:
// each distinct weight content becomes a NamedWeight keyed
// `key_prefix + <16 hex digits of hash_bytes>`, its tensors kNamedWeight, and
// `desc.weights` is emptied. Returns the bytes of each named weight, in
// `desc.named_weights` order. `key_prefix` must be non-empty. Weights that
// were already named stay as they are, and derived weights stay derived: their
// copies name source tensors by index (unchanged) at tensor-relative offsets,
// so they read the same bytes from the named weights.
Result<std::vector<std::vector<uint8_t>>> externalize_weights(EngineDesc* desc,
                                                              const std::string& key_prefix);

// `bytes` (what externalize_weights returned for `desc`, moved from) with
// each weight's key and first tensor's name; weights named before that call
// (empty: their bytes are elsewhere) are left out.
std::vector<ExternalWeight> external_weights(const EngineDesc& desc, std::vector<std::vector<uint8_t>> bytes);

// CRC-32C (Castagnoli) of `size` bytes.
uint32_t crc32c(const void* data, size_t size, uint32_t seed = 0);

}  // namespace kiln::engine
