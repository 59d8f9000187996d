// Kiln's IR: a typed tensor graph built from one partition's FX nodes.
// Values are tensors with a dtype and a static shape; constants carry their
// bytes. Nodes name an ATen op ("aten.addmm.default") and carry the op's
// non-tensor arguments as attributes keyed by the schema's argument names.
//
// Compiler code: may throw kiln::CompileError.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "ir/bytes.h"
#include "engine_format/engine_desc.h"

namespace kiln {

// Thrown by compiler code (IR, passes, codegen); the Python layer turns it
// into a Python exception with the same text.
class CompileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace kiln

namespace kiln::ir {

using engine::DType;

using Attr = std::variant<int64_t, double, bool, std::string,
                          std::vector<int64_t>, std::vector<double>>;

struct Value {
  int id = -1;
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  bool is_constant = false;
  bool is_state = false;      // mutable state (Graph::states): its value before this run
  Bytes data;  // constants: contiguous row-major bytes; states: initial value (empty: zeros); shared, immutable
  int producer = -1;          // node index, -1 for inputs and constants

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * engine::dtype_size(dtype); }
};

struct Node {
  std::string op;  // e.g. "aten.addmm.default"
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::map<std::string, Attr> attrs;
  std::string name;  // the FX node's name, for messages

  bool has_attr(const std::string& key) const { return attrs.count(key) != 0; }
  int64_t int_attr(const std::string& key, int64_t fallback) const;
  double float_attr(const std::string& key, double fallback) const;
  std::string string_attr(const std::string& key, const std::string& fallback) const;
  std::vector<int64_t> ints_attr(const std::string& key) const;
};

// Mutable state (a KV cache): `value` is its content when a run starts;
// `update`, when set, the value it holds after the run (written in place).
// `key` names it across engines ("kiln/<model id>/state/<buffer>").
struct State {
  int value = -1;
  int update = -1;
  std::string key;
};

class Graph {
 public:
  int add_input(const std::string& name, DType dtype, std::vector<int64_t> shape);
  int add_constant(const std::string& name, DType dtype, std::vector<int64_t> shape, Bytes data);
  // Adds a node whose outputs are new values with the given dtypes/shapes
  // (as recorded by FX's fake-tensor metadata). Returns the node index.
  int add_node(const std::string& op, const std::string& name, std::vector<int> inputs,
               std::map<std::string, Attr> attrs,
               const std::vector<std::pair<DType, std::vector<int64_t>>>& output_types);
  void set_outputs(std::vector<int> outputs) { outputs_ = std::move(outputs); }
  // An intermediate no node produces: a planned step writes it for a later
  // step to read (e.g. an attention's per-split partial results).
  int add_scratch(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    return new_value(name, dtype, std::move(shape));
  }
  // A state value (no producer, not an input); `init` is its initial bytes
  // (empty: zeros).
  int add_state(const std::string& name, DType dtype, std::vector<int64_t> shape, const std::string& key,
                Bytes init = {});
  // After a run, state `state` (a value from add_state) holds `value`.
  void set_state_update(int state, int value);
  const std::vector<State>& states() const { return states_; }
  std::vector<State>& states() { return states_; }

  const std::vector<Value>& values() const { return values_; }
  std::vector<Value>& values() { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  const std::vector<int>& inputs() const { return inputs_; }
  const std::vector<int>& outputs() const { return outputs_; }
  const Value& value(int id) const { return values_.at(static_cast<size_t>(id)); }
  Value& value(int id) { return values_.at(static_cast<size_t>(id)); }

  // Throws CompileError naming the first structural problem: dangling value
  // ids, a value produced twice, a node using a value before it exists,
  // constants whose byte size does not match their shape.
  void verify() const;

  std::string describe() const;  // one line per node, for logs and tests

 private:
  int new_value(const std::string& name, DType dtype, std::vector<int64_t> shape);

  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<int> inputs_;
  std::vector<int> outputs_;
  std::vector<State> states_;
};

int64_t numel_of(const std::vector<int64_t>& shape);
// Row-major element strides of a contiguous tensor of `shape`.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace kiln::ir
