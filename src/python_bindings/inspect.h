// inspect_engine: a serialized engine -> plain Python data (dicts and lists),
// for tests, `kiln` tooling and users checking what a .pte will run.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

namespace kiln::python {

namespace nb = nanobind;

// Parses and validates `data`; raises ValueError with the Status text when it
// is not a valid engine.
nb::dict inspect_engine(nb::bytes data);

// engine::externalize_weights on serialized bytes: returns (engine bytes,
// [(key, name of the first tensor using it, weight bytes)]) for the weights it
// moved out; raises ValueError when `data` is not a valid engine or
// `key_prefix` is empty.
nb::tuple externalize_engine_weights(nb::bytes data, const std::string& key_prefix);

}  // namespace kiln::python
