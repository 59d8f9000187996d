// The bytes of a constant (or a state's initial value), shared between the
// graphs that hold it. Passes copy the graph (each rewrite builds a new one),
// and a language model's weights are most of a graph: copying them at every
// pass made compiling the 410M Llama's decode engine spend most of its time
// zero-filling fresh pages. A Bytes is immutable; a pass that changes a
// constant makes a new one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kiln::ir {

class Bytes {
 public:
  Bytes() = default;
  Bytes(std::vector<uint8_t> bytes)  // NOLINT(google-explicit-constructor): a vector is a Bytes
      : bytes_(std::make_shared<const std::vector<uint8_t>>(std::move(bytes))) {}

  size_t size() const { return bytes_ ? bytes_->size() : 0; }
  bool empty() const { return size() == 0; }
  const uint8_t* data() const { return bytes_ ? bytes_->data() : nullptr; }
  std::vector<uint8_t>::const_iterator begin() const { return vector().begin(); }
  std::vector<uint8_t>::const_iterator end() const { return vector().end(); }
  const uint8_t& operator[](size_t i) const { return (*bytes_)[i]; }
  // The bytes as a vector, for code that reads one (no copy).
  const std::vector<uint8_t>& vector() const {
    static const std::vector<uint8_t> kEmpty;
    return bytes_ ? *bytes_ : kEmpty;
  }
  operator const std::vector<uint8_t>&() const { return vector(); }  // NOLINT(google-explicit-constructor)

  friend bool operator==(const Bytes& a, const Bytes& b) { return a.vector() == b.vector(); }
  friend bool operator==(const Bytes& a, const std::vector<uint8_t>& b) { return a.vector() == b; }
  friend bool operator==(const std::vector<uint8_t>& a, const Bytes& b) { return a == b.vector(); }

 private:
  std::shared_ptr<const std::vector<uint8_t>> bytes_;
};

}  // namespace kiln::ir
