// Little-endian byte buffers for the engine format (private to
// src/engine_format and its tests).
//
// ByteWriter appends; a value that cannot be encoded (a string longer than
// 4 GiB) makes it remember the first error instead of throwing, so the writer
// checks status() once at the end.
//
// ByteReader reads from a borrowed (pointer, size) range and never reads out
// of bounds: every read returns a Status, and a failed read leaves the
// position unchanged. Callers name what they were reading with
// KILN_READ_OR_RETURN, which formats that context only on the failure path:
//   "tensor 3 shape dim 1: read past end of section 'tensors' (offset 120,
//    need 8, have 4)"
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace kiln::engine {

class ByteWriter {
 public:
  void put_u8(uint8_t v) { buffer_.push_back(v); }
  void put_u16(uint16_t v);
  void put_u32(uint32_t v);
  void put_u64(uint64_t v);
  void put_i64(int64_t v) { put_u64(static_cast<uint64_t>(v)); }
  void put_f32(float v);  // IEEE-754 bits, so NaN payloads round trip
  void put_raw(const void* data, size_t size);
  // u32 byte length + bytes.
  void put_string(const std::string& s);
  void put_bytes(const std::vector<uint8_t>& bytes);
  // Appends zero bytes until size() is a multiple of `alignment` (a power of
  // two).
  void pad_to(size_t alignment);

  // Overwrites 4 bytes at `offset` (which must already be written); used to
  // patch fields whose value is known only later.
  void patch_u32(size_t offset, uint32_t v);
  void patch_u64(size_t offset, uint64_t v);

  size_t size() const { return buffer_.size(); }
  const std::vector<uint8_t>& buffer() const { return buffer_; }
  std::vector<uint8_t> take() { return std::move(buffer_); }
  void reserve(size_t n) { buffer_.reserve(n); }

  // The first encoding error, or ok.
  const Status& status() const { return status_; }

 private:
  void put_length(size_t length, const char* what);

  std::vector<uint8_t> buffer_;
  Status status_;
};

class ByteReader {
 public:
  // `section` names the range in messages; it must outlive the reader.
  ByteReader(const uint8_t* data, size_t size, const char* section)
      : data_(data), size_(size), section_(section) {}

  Status read_u8(uint8_t* out);
  Status read_u16(uint16_t* out);
  Status read_u32(uint32_t* out);
  Status read_u64(uint64_t* out);
  Status read_i64(int64_t* out);
  Status read_f32(float* out);
  Status read_bool(bool* out);  // one byte, 0 or 1; anything else is corrupt
  Status read_string(std::string* out);
  Status read_bytes(std::vector<uint8_t>* out);
  // Reads a u32 element count and rejects it when the remaining bytes cannot
  // hold `count` elements of at least `min_element_bytes` each, so a flipped
  // bit cannot make the caller allocate gigabytes.
  Status read_count(uint32_t* out, size_t min_element_bytes);
  Status skip(size_t n);
  // Points `*out` at the next `n` bytes (borrowed from the reader's range)
  // and moves past them; for a nested reader over a length-prefixed part.
  Status read_span(size_t n, const uint8_t** out);

  // kCorruptData unless every byte was consumed.
  Status expect_end() const;

  size_t offset() const { return offset_; }
  size_t remaining() const { return size_ - offset_; }
  const char* section() const { return section_; }

 private:
  // Checks that `n` more bytes exist; the error names offset/need/have.
  Status need(size_t n) const;
  // Reads `n` (<= 8) bytes as a little-endian integer; caller checked need().
  uint64_t take_le(size_t n);

  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
  const char* section_;
};

// Little-endian helpers for fixed-layout fields (header, section table).
uint32_t load_le32(const uint8_t* p);
uint64_t load_le64(const uint8_t* p);

// printf-style "context: message" without allocating on the success path.
Status add_context(const Status& status, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

// Checked arithmetic for sizes read from untrusted data.
inline bool checked_add(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}
inline bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

}  // namespace kiln::engine

// Evaluates `expr` (a Status); on failure returns it prefixed with the
// printf-formatted context.
#define KILN_READ_OR_RETURN(expr, ...)                                \
  do {                                                                \
    ::kiln::Status kiln_read_status_ = (expr);                        \
    if (!kiln_read_status_.is_ok())                                   \
      return ::kiln::engine::add_context(kiln_read_status_, __VA_ARGS__); \
  } while (0)
