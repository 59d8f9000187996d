// SHA-256 (FIPS 180-4), for naming entries of the on-disk kernel cache by
// the content they were built from (kernel_disk_cache.h). Written here
// rather than linking OpenSSL: the compiler would otherwise gain a library
// that a fresh CI machine does not have, for one hash of a few KiB per
// module.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::codegen {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(const std::string& text) { update(text.data(), text.size()); }
  // The digest; the object must not be updated afterwards.
  std::array<uint8_t, 32> finish();
  // finish() as 64 lowercase hex digits.
  std::string hex();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buffer_[64];
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes
};

}  // namespace kiln::codegen
