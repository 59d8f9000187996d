#include "inspect.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "convert.h"
#include "engine_format/engine_format.h"
#include "engine_format/step_format.h"

namespace kiln::python {

namespace {

using namespace kiln::engine;

const char* storage_name(StorageKind kind) {
  switch (kind) {
    case StorageKind::kInput: return "input";
    case StorageKind::kOutput: return "output";
    case StorageKind::kArena: return "arena";
    case StorageKind::kWeight: return "weight";
    case StorageKind::kNamedWeight: return "named_weight";
    case StorageKind::kState: return "state";
    case StorageKind::kDerivedWeight: return "derived_weight";
  }
  return "unknown";
}

template <typename T>
nb::list to_list(const T* values, size_t count) {
  nb::list list;
  for (size_t i = 0; i < count; ++i) list.append(values[i]);
  return list;
}

template <typename V>
nb::list to_list(const V& values) {
  return to_list(values.data(), values.size());
}

// kNoTensor -> None, so Python code does not have to know the sentinel.
nb::object tensor_index(uint32_t index) {
  if (index == kNoTensor) return nb::none();
  return nb::int_(index);
}

nb::dict tensor_dict(const TensorDesc& t) {
  nb::dict d;
  d["name"] = t.name;
  d["dtype"] = dtype_name(t.dtype);
  d["shape"] = to_list(t.shape);
  d["storage"] = storage_name(t.storage);
  d["io_index"] = t.io_index;
  d["offset"] = t.offset;
  d["nbytes"] = t.nbytes;
  return d;
}

// Builds a step's dict from the fields its kind describes (StepFormat::describe),
// so this file knows no step kind.
class DictSink : public StepFieldSink {
 public:
  explicit DictSink(nb::dict d) : top_(std::move(d)) {}
  void text(const char* key, const std::string& value) override { target()[key] = value; }
  void integer(const char* key, int64_t value) override { target()[key] = value; }
  void real(const char* key, double value) override { target()[key] = value; }
  void flag(const char* key, bool value) override { target()[key] = value; }
  void tensor(const char* key, uint32_t index) override { target()[key] = tensor_index(index); }
  void integers(const char* key, const std::vector<int64_t>& values) override {
    target()[key] = to_list(values);
  }
  void begin_list(const char* key) override {
    list_ = nb::list();
    list_key_ = key;
    in_list_ = true;
  }
  void begin_record() override {
    record_ = nb::dict();
    list_.append(record_);
  }
  void end_list() override {
    top_[list_key_.c_str()] = list_;
    in_list_ = false;
  }

 private:
  nb::dict& target() { return in_list_ ? record_ : top_; }

  nb::dict top_;
  nb::list list_;
  nb::dict record_;
  std::string list_key_;
  bool in_list_ = false;
};

nb::dict step_dict(const Step& s) {
  nb::dict d;
  d["label"] = s.label;
  const StepFormat* format = find_step_format(s.kind);  // parse_engine checked the kind
  d["kind"] = format->name;
  DictSink sink(d);
  format->describe(s, sink);
  return d;
}

nb::dict module_dict(const KernelModule& m) {
  nb::dict d;
  nb::list sms, cubin_bytes;
  for (const CubinImage& cubin : m.cubins) {
    sms.append(cubin.sm);
    cubin_bytes.append(cubin.image.size());
  }
  d["name"] = m.name;
  d["sms"] = sms;
  d["cubin_bytes"] = cubin_bytes;
  d["ptx_sm"] = m.ptx_sm;
  d["ptx_bytes"] = m.ptx.size();
  d["source"] = m.source;
  return d;
}

}  // namespace

nb::dict inspect_engine(nb::bytes data) {
  Result<EngineDesc> parsed = [&] {
    nb::gil_scoped_release release;
    return parse_engine(data.c_str(), data.size());
  }();
  if (!parsed.is_ok())
    throw nb::value_error(("not a valid Kiln engine: " + parsed.status().to_string()).c_str());
  const EngineDesc& desc = parsed.value();

  nb::dict out;
  nb::list tensors, steps, modules;
  for (const TensorDesc& t : desc.tensors) tensors.append(tensor_dict(t));
  for (const Step& s : desc.steps) steps.append(step_dict(s));
  for (const KernelModule& m : desc.modules) modules.append(module_dict(m));
  out["tensors"] = tensors;
  out["inputs"] = to_list(desc.inputs);
  out["outputs"] = to_list(desc.outputs);
  out["steps"] = steps;
  out["modules"] = modules;
  out["arena_bytes"] = desc.arena_bytes;
  out["weights_bytes"] = desc.weights.size();
  nb::list named;
  for (const NamedWeight& n : desc.named_weights) {
    nb::dict d;
    d["key"] = n.key;
    d["nbytes"] = n.nbytes;
    d["hash"] = n.hash;
    named.append(d);
  }
  out["named_weights"] = named;
  // Weights the runtime makes at load from the others (format v6): the copy
  // list is summarized (a model's can hold ~10^5 copies).
  nb::list derived;
  for (const DerivedWeight& w : desc.derived_weights) {
    nb::dict d;
    d["name"] = w.name;
    d["nbytes"] = w.nbytes;
    d["copies"] = w.copies.size();
    uint64_t copied = 0;
    for (const DerivedCopy& c : w.copies) copied += uint64_t{c.rows} * c.row_bytes;
    d["copied_bytes"] = copied;
    derived.append(d);
  }
  out["derived_weights"] = derived;
  nb::dict metadata;
  for (const auto& [key, value] : desc.metadata) metadata[key.c_str()] = value;
  out["metadata"] = metadata;
  return out;
}

nb::tuple externalize_engine_weights(nb::bytes data, const std::string& key_prefix) {
  std::vector<uint8_t> engine_bytes;
  std::vector<ExternalWeight> weights;
  {
    nb::gil_scoped_release release;
    Result<EngineDesc> parsed = parse_engine(data.c_str(), data.size());
    if (!parsed.is_ok())
      throw nb::value_error(("not a valid Kiln engine: " + parsed.status().to_string()).c_str());
    EngineDesc desc = std::move(parsed).value();
    Result<std::vector<std::vector<uint8_t>>> split = externalize_weights(&desc, key_prefix);
    if (!split.is_ok()) throw nb::value_error(split.status().to_string().c_str());
    weights = external_weights(desc, std::move(split).value());
    Result<std::vector<uint8_t>> bytes = serialize_engine(desc);
    if (!bytes.is_ok()) throw nb::value_error(bytes.status().to_string().c_str());
    engine_bytes = std::move(bytes).value();
  }
  return nb::make_tuple(nb::bytes(reinterpret_cast<const char*>(engine_bytes.data()), engine_bytes.size()),
                        external_weights_to_python(weights));
}

}  // namespace kiln::python
