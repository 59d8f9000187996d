// A variant set: the delegate blob of a partition exported with dynamic
// shapes (torch.export Dims). Kiln compiles static shapes, so such a
// partition becomes one engine per shape variant (each a complete engine of
// the usual format, its sizes constants) plus the shape model that picks one
// at execute: the symbols with their exported ranges, which input dim each
// symbol is, and each variant's symbol values. See docs/design_llm.md,
// "Dynamic shapes".
//
// Variants with equal values are *alternatives* (version 2): engines for the same shapes, in order
// of preference; the delegate runs the first one that can run on the GPU and stream at hand and
// keeps the next for the streams the first refuses (a persistent decode engine, with the usual
// engine as its fallback: kiln.compile(persistent_decode=True)). A static partition with
// alternatives is a set with no symbols and no bindings.
//
// Layout (little-endian): magic "KILNVSET", u32 version, u32 symbol count,
// per symbol {string name, i64 min, i64 max}; u32 binding count, per binding
// {u32 input, u32 dim, u32 symbol}; u32 variant count, per variant {i64 value
// per symbol, u64 offset, u64 size} of its engine, whose bytes follow the
// header (each at a 16-byte aligned offset from the blob's start).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace kiln::engine {

inline constexpr uint32_t kVariantSetVersion = 2;     // what the writer writes
inline constexpr uint32_t kVariantSetMinVersion = 1;  // the oldest the reader takes (no alternatives)
// Bounds a corrupt header cannot exceed (the export side refuses more).
inline constexpr size_t kMaxVariantSymbols = 8;
inline constexpr size_t kMaxVariants = 64;

struct VariantSymbol {
  std::string name;  // torch.export's symbol (s0, s11, ...)
  int64_t min = 0, max = 0;  // the exported range, inclusive
};

// Input `input`'s dim `dim` is the symbol `symbol`.
struct VariantBinding {
  uint32_t input = 0, dim = 0, symbol = 0;
};

struct VariantSetDesc {
  std::vector<VariantSymbol> symbols;
  std::vector<VariantBinding> bindings;
  std::vector<std::vector<int64_t>> values;  // per variant, one value per symbol
};

// One variant's engine inside a parsed blob (borrowed bytes).
struct VariantEngine {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// True when `data` starts with the variant-set magic (anything else is
// treated as a single engine).
bool is_variant_set(const void* data, size_t size);

// The blob for `desc` and one engine per variant (desc.values.size() ==
// engines.size()). Checks what the reader checks.
Result<std::vector<uint8_t>> serialize_variant_set(const VariantSetDesc& desc,
                                                   const std::vector<std::vector<uint8_t>>& engines);

// Parses and checks a blob: every value inside its symbol's range, every
// binding naming a known symbol, engines inside the blob; engines point into
// `data`, which must outlive them.
Status parse_variant_set(const void* data, size_t size, VariantSetDesc* desc,
                         std::vector<VariantEngine>* engines);

// "s0 in [1, 512] (input 0 dim 1)" for messages and kiln inspect.
std::string describe_symbol(const VariantSetDesc& desc, size_t symbol);

}  // namespace kiln::engine
