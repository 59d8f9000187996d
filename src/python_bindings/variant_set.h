// The variant-set container (engine_format/variant_set.h) for the Python
// front end: a partition exported with dynamic shapes is compiled once per
// shape variant and packed into one delegate blob.
#pragma once

#include <nanobind/nanobind.h>

namespace kiln::python {

namespace nb = nanobind;

// pack_variant_set(symbols [(name, min, max)], bindings [(input, dim, symbol)],
// values [[value per symbol] per variant], engines [bytes per variant]) -> bytes;
// ValueError when the description is inconsistent.
nb::bytes pack_variant_set(nb::list symbols, nb::list bindings, nb::list values, nb::list engines);

// The inverse: a dict with "symbols", "bindings", "values", "engines";
// ValueError when `data` is not a valid variant set.
nb::dict unpack_variant_set(nb::bytes data);

bool is_variant_set(nb::bytes data);

}  // namespace kiln::python
