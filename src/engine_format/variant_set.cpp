#include "engine_format/variant_set.h"

#include <cstring>

#include "engine_format/byte_io.h"

namespace kiln::engine {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'V', 'S', 'E', 'T'};
constexpr size_t kEngineAlignment = 16;

// The checks both directions share.
Status check_desc(const VariantSetDesc& desc, size_t engines) {
  if (desc.symbols.size() > kMaxVariantSymbols)
    return make_status(StatusCode::kCorruptData, "variant set: %zu symbols (expected at most %zu)",
                       desc.symbols.size(), kMaxVariantSymbols);
  if (desc.symbols.empty() && !desc.bindings.empty())
    return make_status(StatusCode::kCorruptData, "variant set: %zu bindings but no symbols", desc.bindings.size());
  if (engines == 0 || engines > kMaxVariants || desc.values.size() != engines)
    return make_status(StatusCode::kCorruptData,
                       "variant set: %zu variants with %zu engines (expected 1 to %zu, one each)",
                       desc.values.size(), engines, kMaxVariants);
  for (size_t s = 0; s < desc.symbols.size(); ++s) {
    const VariantSymbol& sym = desc.symbols[s];
    if (sym.min < 0 || sym.max < sym.min)
      return make_status(StatusCode::kCorruptData, "variant set: symbol %s has the range [%lld, %lld]",
                         sym.name.c_str(), static_cast<long long>(sym.min), static_cast<long long>(sym.max));
  }
  for (const VariantBinding& b : desc.bindings)
    if (b.symbol >= desc.symbols.size())
      return make_status(StatusCode::kCorruptData, "variant set: input %u dim %u names symbol %u of %zu",
                         b.input, b.dim, b.symbol, desc.symbols.size());
  for (size_t v = 0; v < desc.values.size(); ++v) {
    if (desc.values[v].size() != desc.symbols.size())
      return make_status(StatusCode::kCorruptData, "variant set: variant %zu has %zu values for %zu symbols", v,
                         desc.values[v].size(), desc.symbols.size());
    for (size_t s = 0; s < desc.symbols.size(); ++s) {
      const int64_t value = desc.values[v][s];
      if (value < desc.symbols[s].min || value > desc.symbols[s].max)
        return make_status(StatusCode::kCorruptData, "variant set: variant %zu has %s = %lld, outside [%lld, %lld]",
                           v, desc.symbols[s].name.c_str(), static_cast<long long>(value),
                           static_cast<long long>(desc.symbols[s].min), static_cast<long long>(desc.symbols[s].max));
    }
  }
  return Status::ok();
}

}  // namespace

bool is_variant_set(const void* data, size_t size) {
  return data != nullptr && size >= sizeof(kMagic) && std::memcmp(data, kMagic, sizeof(kMagic)) == 0;
}

Result<std::vector<uint8_t>> serialize_variant_set(const VariantSetDesc& desc,
                                                   const std::vector<std::vector<uint8_t>>& engines) {
  KILN_RETURN_IF_ERROR(check_desc(desc, engines.size()));
  ByteWriter w;
  w.put_raw(kMagic, sizeof(kMagic));
  w.put_u32(kVariantSetVersion);
  w.put_u32(static_cast<uint32_t>(desc.symbols.size()));
  for (const VariantSymbol& sym : desc.symbols) {
    w.put_string(sym.name);
    w.put_i64(sym.min);
    w.put_i64(sym.max);
  }
  w.put_u32(static_cast<uint32_t>(desc.bindings.size()));
  for (const VariantBinding& b : desc.bindings) {
    w.put_u32(b.input);
    w.put_u32(b.dim);
    w.put_u32(b.symbol);
  }
  w.put_u32(static_cast<uint32_t>(engines.size()));
  std::vector<size_t> offset_at(engines.size());
  for (size_t v = 0; v < engines.size(); ++v) {
    for (int64_t value : desc.values[v]) w.put_i64(value);
    offset_at[v] = w.size();
    w.put_u64(0);  // patched below
    w.put_u64(engines[v].size());
  }
  for (size_t v = 0; v < engines.size(); ++v) {
    w.pad_to(kEngineAlignment);
    w.patch_u64(offset_at[v], w.size());
    w.put_raw(engines[v].data(), engines[v].size());
  }
  KILN_RETURN_IF_ERROR(w.status());
  return w.take();
}

Status parse_variant_set(const void* data, size_t size, VariantSetDesc* desc,
                         std::vector<VariantEngine>* engines) {
  if (!is_variant_set(data, size))
    return make_status(StatusCode::kCorruptData, "not a Kiln variant set (no KILNVSET magic)");
  const auto* bytes = static_cast<const uint8_t*>(data);
  ByteReader r(bytes, size, "variant set");
  KILN_READ_OR_RETURN(r.skip(sizeof(kMagic)), "magic");
  uint32_t version = 0, count = 0;
  KILN_READ_OR_RETURN(r.read_u32(&version), "version");
  if (version < kVariantSetMinVersion || version > kVariantSetVersion)
    return make_status(StatusCode::kIncompatible,
                       "variant set version %u, this Kiln reads versions %u to %u; rebuild the .pte with this Kiln",
                       version, kVariantSetMinVersion, kVariantSetVersion);
  *desc = VariantSetDesc{};
  KILN_READ_OR_RETURN(r.read_count(&count, 20), "symbol count");
  if (count > kMaxVariantSymbols)
    return make_status(StatusCode::kCorruptData, "variant set: %u symbols (at most %zu)", count, kMaxVariantSymbols);
  desc->symbols.resize(count);
  for (uint32_t s = 0; s < count; ++s) {
    KILN_READ_OR_RETURN(r.read_string(&desc->symbols[s].name), "symbol %u name", s);
    KILN_READ_OR_RETURN(r.read_i64(&desc->symbols[s].min), "symbol %u min", s);
    KILN_READ_OR_RETURN(r.read_i64(&desc->symbols[s].max), "symbol %u max", s);
  }
  KILN_READ_OR_RETURN(r.read_count(&count, 12), "binding count");
  desc->bindings.resize(count);
  for (uint32_t b = 0; b < count; ++b) {
    KILN_READ_OR_RETURN(r.read_u32(&desc->bindings[b].input), "binding %u input", b);
    KILN_READ_OR_RETURN(r.read_u32(&desc->bindings[b].dim), "binding %u dim", b);
    KILN_READ_OR_RETURN(r.read_u32(&desc->bindings[b].symbol), "binding %u symbol", b);
  }
  KILN_READ_OR_RETURN(r.read_count(&count, 16 + 8 * desc->symbols.size()), "variant count");
  if (count > kMaxVariants)
    return make_status(StatusCode::kCorruptData, "variant set: %u variants (at most %zu)", count, kMaxVariants);
  desc->values.assign(count, std::vector<int64_t>(desc->symbols.size()));
  engines->assign(count, VariantEngine{});
  for (uint32_t v = 0; v < count; ++v) {
    for (size_t s = 0; s < desc->symbols.size(); ++s)
      KILN_READ_OR_RETURN(r.read_i64(&desc->values[v][s]), "variant %u value %zu", v, s);
    uint64_t offset = 0, length = 0, end = 0;
    KILN_READ_OR_RETURN(r.read_u64(&offset), "variant %u offset", v);
    KILN_READ_OR_RETURN(r.read_u64(&length), "variant %u size", v);
    if (!checked_add(offset, length, &end) || offset < r.offset() || end > size || length == 0)
      return make_status(StatusCode::kCorruptData,
                         "variant set: variant %u's engine [%llu, +%llu) is outside the %zu-byte blob", v,
                         static_cast<unsigned long long>(offset), static_cast<unsigned long long>(length), size);
    (*engines)[v] = VariantEngine{bytes + offset, static_cast<size_t>(length)};
  }
  return check_desc(*desc, engines->size());
}

std::string describe_symbol(const VariantSetDesc& desc, size_t symbol) {
  const VariantSymbol& sym = desc.symbols[symbol];
  std::string out = sym.name + " in [" + std::to_string(sym.min) + ", " + std::to_string(sym.max) + "]";
  std::string where;
  for (const VariantBinding& b : desc.bindings)
    if (b.symbol == symbol)
      where += (where.empty() ? "" : ", ") + std::string("input ") + std::to_string(b.input) + " dim " +
               std::to_string(b.dim);
  if (!where.empty()) out += " (" + where + ")";
  return out;
}

}  // namespace kiln::engine
