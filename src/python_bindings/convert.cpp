#include "convert.h"

#include <string>

namespace kiln::python {

engine::DType dtype_from_string(const std::string& name, const char* what) {
  using engine::DType;
  if (name == "float32") return DType::kFloat32;
  if (name == "float16") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  if (name == "int64") return DType::kInt64;
  if (name == "int32") return DType::kInt32;
  if (name == "bool") return DType::kBool;
  throw nb::value_error((std::string(what) + ": unknown dtype '" + name +
                         "' (expected float32, float16, bfloat16, int64, int32 or bool)")
                            .c_str());
}

std::vector<int64_t> shape_from_python(nb::handle obj, const char* what) {
  if (!nb::isinstance<nb::list>(obj) && !nb::isinstance<nb::tuple>(obj))
    throw nb::type_error((std::string(what) + ": shape must be a list of ints").c_str());
  std::vector<int64_t> shape;
  for (nb::handle dim : obj) {
    if (nb::isinstance<nb::bool_>(dim) || !nb::isinstance<nb::int_>(dim))
      throw nb::type_error((std::string(what) + ": shape must be a list of ints").c_str());
    int64_t value = nb::cast<int64_t>(dim);
    if (value < 0)
      throw nb::value_error(
          (std::string(what) + ": negative dimension " + std::to_string(value)).c_str());
    shape.push_back(value);
  }
  return shape;
}

static ir::Attr list_attr(const std::string& key, nb::handle list) {
  bool any_float = false;
  for (nb::handle item : list) {
    if (nb::isinstance<nb::float_>(item)) {
      any_float = true;
    } else if (nb::isinstance<nb::bool_>(item) || !nb::isinstance<nb::int_>(item)) {
      throw nb::type_error(("attribute '" + key +
                            "': list items must be int or float, got " +
                            std::string(nb::type_name(item.type()).c_str()))
                               .c_str());
    }
  }
  if (any_float) {
    std::vector<double> values;
    for (nb::handle item : list) values.push_back(nb::cast<double>(item));
    return values;
  }
  std::vector<int64_t> values;
  for (nb::handle item : list) values.push_back(nb::cast<int64_t>(item));
  return values;
}

std::map<std::string, ir::Attr> attrs_from_python(nb::handle obj) {
  std::map<std::string, ir::Attr> attrs;
  if (obj.is_none()) return attrs;
  if (!nb::isinstance<nb::dict>(obj)) throw nb::type_error("attrs must be a dict");
  for (auto [key_obj, value] : nb::borrow<nb::dict>(obj)) {
    if (!nb::isinstance<nb::str>(key_obj)) throw nb::type_error("attrs keys must be str");
    std::string key = nb::cast<std::string>(key_obj);
    if (nb::isinstance<nb::bool_>(value)) {
      attrs[key] = nb::cast<bool>(value);
    } else if (nb::isinstance<nb::int_>(value)) {
      attrs[key] = nb::cast<int64_t>(value);
    } else if (nb::isinstance<nb::float_>(value)) {
      attrs[key] = nb::cast<double>(value);
    } else if (nb::isinstance<nb::str>(value)) {
      attrs[key] = nb::cast<std::string>(value);
    } else if (nb::isinstance<nb::list>(value) || nb::isinstance<nb::tuple>(value)) {
      attrs[key] = list_attr(key, value);
    } else {
      throw nb::type_error(("attribute '" + key +
                            "' must be int, float, bool, str or a list of int/float, got " +
                            std::string(nb::type_name(value.type()).c_str()))
                               .c_str());
    }
  }
  return attrs;
}

nb::object attr_to_python(const ir::Attr& attr) {
  return std::visit(
      [](const auto& value) -> nb::object {
        using T = std::decay_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                      std::is_same_v<T, std::vector<double>>) {
          nb::list list;
          for (auto item : value) list.append(nb::cast(item));
          return list;
        } else {
          return nb::cast(value);
        }
      },
      attr);
}

nb::list external_weights_to_python(std::vector<engine::ExternalWeight>& weights) {
  nb::list entries;
  for (engine::ExternalWeight& w : weights) {
    entries.append(nb::make_tuple(w.key, w.tensor_name,
                                  nb::bytes(reinterpret_cast<const char*>(w.bytes.data()), w.bytes.size())));
    std::vector<uint8_t>().swap(w.bytes);
  }
  return entries;
}

}  // namespace kiln::python
