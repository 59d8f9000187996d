// What the capability query sees of one node: op name, tensor types and
// attributes, without a graph (the Python partitioner describes FX nodes
// this way). Plain data, shared by the op registry and the compiler's API.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::ops {

struct TensorInfo {
  engine::DType dtype = engine::DType::kFloat32;
  std::vector<int64_t> shape;
  bool is_constant = false;  // a parameter, buffer or lifted constant
};

struct OpQuery {
  std::string op;
  std::vector<TensorInfo> inputs;  // tensor arguments, in schema order
  std::map<std::string, ir::Attr> attrs;
  std::vector<TensorInfo> outputs;
};

}  // namespace kiln::ops
