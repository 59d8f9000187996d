#include "variant_set.h"

#include <nanobind/stl/string.h>

#include <string>
#include <vector>

#include "engine_format/variant_set.h"

namespace kiln::python {

nb::bytes pack_variant_set(nb::list symbols, nb::list bindings, nb::list values, nb::list engines) {
  engine::VariantSetDesc desc;
  for (nb::handle item : symbols) {
    nb::tuple t = nb::cast<nb::tuple>(item);
    desc.symbols.push_back({nb::cast<std::string>(t[0]), nb::cast<int64_t>(t[1]), nb::cast<int64_t>(t[2])});
  }
  for (nb::handle item : bindings) {
    nb::tuple t = nb::cast<nb::tuple>(item);
    desc.bindings.push_back({nb::cast<uint32_t>(t[0]), nb::cast<uint32_t>(t[1]), nb::cast<uint32_t>(t[2])});
  }
  for (nb::handle item : values) {
    std::vector<int64_t> row;
    for (nb::handle v : nb::cast<nb::list>(item)) row.push_back(nb::cast<int64_t>(v));
    desc.values.push_back(std::move(row));
  }
  std::vector<std::vector<uint8_t>> blobs;
  for (nb::handle item : engines) {
    nb::bytes b = nb::cast<nb::bytes>(item);
    const auto* p = reinterpret_cast<const uint8_t*>(b.c_str());
    blobs.emplace_back(p, p + b.size());
  }
  Result<std::vector<uint8_t>> out = engine::serialize_variant_set(desc, blobs);
  if (!out.is_ok()) throw nb::value_error(out.status().to_string().c_str());
  return nb::bytes(reinterpret_cast<const char*>(out->data()), out->size());
}

nb::dict unpack_variant_set(nb::bytes data) {
  engine::VariantSetDesc desc;
  std::vector<engine::VariantEngine> engines;
  Status status = engine::parse_variant_set(data.c_str(), data.size(), &desc, &engines);
  if (!status.is_ok()) throw nb::value_error(status.to_string().c_str());
  nb::list symbols, bindings, values, blobs;
  for (const engine::VariantSymbol& s : desc.symbols) symbols.append(nb::make_tuple(s.name, s.min, s.max));
  for (const engine::VariantBinding& b : desc.bindings) bindings.append(nb::make_tuple(b.input, b.dim, b.symbol));
  for (const std::vector<int64_t>& row : desc.values) {
    nb::list r;
    for (int64_t v : row) r.append(v);
    values.append(r);
  }
  for (const engine::VariantEngine& e : engines)
    blobs.append(nb::bytes(reinterpret_cast<const char*>(e.data), e.size));
  nb::dict out;
  out["symbols"] = symbols;
  out["bindings"] = bindings;
  out["values"] = values;
  out["engines"] = blobs;
  return out;
}

bool is_variant_set(nb::bytes data) { return engine::is_variant_set(data.c_str(), data.size()); }

}  // namespace kiln::python
