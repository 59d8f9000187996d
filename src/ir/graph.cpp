#include "ir/graph.h"

#include <limits>
#include <sstream>

namespace kiln::ir {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw CompileError("negative or symbolic dimension in shape " + shape_to_string(shape));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      throw CompileError("shape " + shape_to_string(shape) + " overflows int64");
    n *= d;
  }
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

int64_t Value::numel() const { return numel_of(shape); }

int64_t Node::int_attr(const std::string& key, int64_t fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (auto* v = std::get_if<int64_t>(&it->second)) return *v;
  if (auto* b = std::get_if<bool>(&it->second)) return *b ? 1 : 0;
  if (auto* d = std::get_if<double>(&it->second)) {
    if (*d == static_cast<double>(static_cast<int64_t>(*d))) return static_cast<int64_t>(*d);
  }
  throw CompileError("node '" + name + "' (" + op + "): attribute '" + key + "' is not an integer");
}

double Node::float_attr(const std::string& key, double fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (auto* d = std::get_if<double>(&it->second)) return *d;
  if (auto* v = std::get_if<int64_t>(&it->second)) return static_cast<double>(*v);
  if (auto* b = std::get_if<bool>(&it->second)) return *b ? 1.0 : 0.0;
  throw CompileError("node '" + name + "' (" + op + "): attribute '" + key + "' is not a number");
}

std::string Node::string_attr(const std::string& key, const std::string& fallback) const {
  auto it = attrs.find(key);
  if (it == attrs.end()) return fallback;
  if (auto* s = std::get_if<std::string>(&it->second)) return *s;
  throw CompileError("node '" + name + "' (" + op + "): attribute '" + key + "' is not a string");
}

std::vector<int64_t> Node::ints_attr(const std::string& key) const {
  auto it = attrs.find(key);
  if (it == attrs.end())
    throw CompileError("node '" + name + "' (" + op + "): missing attribute '" + key + "'");
  if (auto* v = std::get_if<std::vector<int64_t>>(&it->second)) return *v;
  if (auto* i = std::get_if<int64_t>(&it->second)) return {*i};
  throw CompileError("node '" + name + "' (" + op + "): attribute '" + key + "' is not a list of integers");
}

int Graph::new_value(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  if (static_cast<uint8_t>(dtype) >= engine::kDTypeCount)
    throw CompileError("value '" + name + "': unknown dtype");
  numel_of(shape);  // validates the dims
  Value v;
  v.id = static_cast<int>(values_.size());
  v.name = name;
  v.dtype = dtype;
  v.shape = std::move(shape);
  values_.push_back(std::move(v));
  return values_.back().id;
}

int Graph::add_input(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  int id = new_value(name, dtype, std::move(shape));
  inputs_.push_back(id);
  return id;
}

int Graph::add_constant(const std::string& name, DType dtype, std::vector<int64_t> shape, Bytes data) {
  int id = new_value(name, dtype, std::move(shape));
  Value& v = values_[static_cast<size_t>(id)];
  if (data.size() != v.nbytes()) {
    throw CompileError("constant '" + name + "': " + std::to_string(data.size()) +
                       " bytes given, shape " + shape_to_string(v.shape) + " of " +
                       engine::dtype_name(dtype) + " needs " + std::to_string(v.nbytes()));
  }
  v.is_constant = true;
  v.data = std::move(data);
  return id;
}

int Graph::add_state(const std::string& name, DType dtype, std::vector<int64_t> shape, const std::string& key,
                     Bytes init) {
  int id = new_value(name, dtype, std::move(shape));
  Value& v = values_[static_cast<size_t>(id)];
  if (!init.empty() && init.size() != v.nbytes())
    throw CompileError("state '" + name + "': " + std::to_string(init.size()) + " bytes of initial value, " +
                       shape_to_string(v.shape) + " of " + engine::dtype_name(dtype) + " needs " +
                       std::to_string(v.nbytes()));
  if (key.empty()) throw CompileError("state '" + name + "' has no key");
  v.is_state = true;
  v.data = std::move(init);
  states_.push_back(State{id, -1, key});
  return id;
}

void Graph::set_state_update(int state, int value) {
  for (State& s : states_) {
    if (s.value != state) continue;
    if (value < 0 || static_cast<size_t>(value) >= values_.size())
      throw CompileError("state '" + values_[static_cast<size_t>(state)].name + "': update value id " +
                         std::to_string(value) + " does not exist");
    s.update = value;
    return;
  }
  throw CompileError("value id " + std::to_string(state) + " is not a state");
}

int Graph::add_node(const std::string& op, const std::string& name, std::vector<int> inputs,
                    std::map<std::string, Attr> attrs,
                    const std::vector<std::pair<DType, std::vector<int64_t>>>& output_types) {
  for (int in : inputs) {
    if (in < 0 || static_cast<size_t>(in) >= values_.size())
      throw CompileError("node '" + name + "' (" + op + "): input value id " + std::to_string(in) +
                         " does not exist");
  }
  Node node;
  node.op = op;
  node.name = name;
  node.inputs = std::move(inputs);
  node.attrs = std::move(attrs);
  int index = static_cast<int>(nodes_.size());
  for (size_t i = 0; i < output_types.size(); ++i) {
    std::string out_name = output_types.size() == 1 ? name : name + "." + std::to_string(i);
    int id = new_value(out_name, output_types[i].first, output_types[i].second);
    values_[static_cast<size_t>(id)].producer = index;
    node.outputs.push_back(id);
  }
  nodes_.push_back(std::move(node));
  return index;
}

void Graph::verify() const {
  std::vector<bool> defined(values_.size(), false);
  for (int id : inputs_) {
    if (id < 0 || static_cast<size_t>(id) >= values_.size())
      throw CompileError("graph input id " + std::to_string(id) + " does not exist");
    defined[static_cast<size_t>(id)] = true;
  }
  for (const State& s : states_) defined[static_cast<size_t>(s.value)] = true;
  for (const Value& v : values_) {
    if (v.is_constant) {
      if (v.data.size() != v.nbytes())
        throw CompileError("constant '" + v.name + "' has " + std::to_string(v.data.size()) +
                           " bytes, expected " + std::to_string(v.nbytes()));
      defined[static_cast<size_t>(v.id)] = true;
    }
  }
  for (size_t n = 0; n < nodes_.size(); ++n) {
    const Node& node = nodes_[n];
    for (int in : node.inputs) {
      if (in < 0 || static_cast<size_t>(in) >= values_.size())
        throw CompileError("node '" + node.name + "': input id " + std::to_string(in) + " does not exist");
      if (!defined[static_cast<size_t>(in)])
        throw CompileError("node '" + node.name + "' (" + node.op + ") uses value '" +
                           values_[static_cast<size_t>(in)].name + "' before it is produced");
    }
    for (int out : node.outputs) {
      const Value& v = values_.at(static_cast<size_t>(out));
      if (defined[static_cast<size_t>(out)] || v.producer != static_cast<int>(n))
        throw CompileError("value '" + v.name + "' is produced twice");
      defined[static_cast<size_t>(out)] = true;
    }
  }
  for (const State& s : states_) {
    const Value& v = value(s.value);
    if (s.update < 0) continue;
    const Value& u = value(s.update);
    if (!defined[static_cast<size_t>(s.update)])
      throw CompileError("state '" + v.name + "': its update '" + u.name + "' is not produced by the graph");
    if (u.dtype != v.dtype || u.shape != v.shape)
      throw CompileError("state '" + v.name + "' is " + engine::dtype_name(v.dtype) + shape_to_string(v.shape) +
                         " but its update '" + u.name + "' is " + engine::dtype_name(u.dtype) +
                         shape_to_string(u.shape));
  }
  if (outputs_.empty() && states_.empty()) throw CompileError("graph has no outputs");
  for (int id : outputs_) {
    if (id < 0 || static_cast<size_t>(id) >= values_.size() || !defined[static_cast<size_t>(id)])
      throw CompileError("graph output id " + std::to_string(id) + " is not produced by the graph");
  }
}

std::string Graph::describe() const {
  std::ostringstream out;
  for (int id : inputs_) {
    const Value& v = value(id);
    out << "input " << v.name << ": " << engine::dtype_name(v.dtype) << shape_to_string(v.shape) << "\n";
  }
  for (const State& s : states_) {
    const Value& v = value(s.value);
    out << "state " << v.name << ": " << engine::dtype_name(v.dtype) << shape_to_string(v.shape) << " '" << s.key
        << "'" << (s.update >= 0 ? " <- " + value(s.update).name : std::string()) << "\n";
  }
  for (const Node& node : nodes_) {
    out << node.name << " = " << node.op << "(";
    for (size_t i = 0; i < node.inputs.size(); ++i) out << (i ? ", " : "") << value(node.inputs[i]).name;
    out << ") -> ";
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const Value& v = value(node.outputs[i]);
      out << (i ? ", " : "") << engine::dtype_name(v.dtype) << shape_to_string(v.shape);
    }
    out << "\n";
  }
  out << "outputs:";
  for (int id : outputs_) out << " " << value(id).name;
  out << "\n";
  return out.str();
}

}  // namespace kiln::ir
