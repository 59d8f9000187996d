// Python <-> C++ conversions shared by the bindings: dtype strings, shapes and
// op attributes. Each raises a Python TypeError/ValueError that names the
// offending argument, so a bad call from the partitioner is easy to trace.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine_format/engine_desc.h"
#include "ir/graph.h"

namespace kiln::python {

namespace nb = nanobind;

// "float32", "float16", "bfloat16", "int64", "int32", "bool".
engine::DType dtype_from_string(const std::string& name, const char* what);

std::vector<int64_t> shape_from_python(nb::handle obj, const char* what);

// dict[str, int | float | bool | str | list[int] | list[float]]. bool is
// checked before int (Python's bool is an int); a list holding any float
// becomes list[float]; an empty list is list[int].
std::map<std::string, ir::Attr> attrs_from_python(nb::handle obj);

nb::object attr_to_python(const ir::Attr& attr);

// [(key, tensor name, bytes)] for weights that left an engine; each weight's
// C++ bytes are freed as soon as Python holds them, so at most one extra copy
// of one weight exists at a time.
nb::list external_weights_to_python(std::vector<engine::ExternalWeight>& weights);

}  // namespace kiln::python
