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

}  // namespace kiln::python
