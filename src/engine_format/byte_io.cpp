#include "engine_format/byte_io.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>

namespace kiln::engine {

// ---- ByteWriter ------------------------------------------------------------

void ByteWriter::put_u16(uint16_t v) {
  put_u8(static_cast<uint8_t>(v));
  put_u8(static_cast<uint8_t>(v >> 8));
}

void ByteWriter::put_u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) put_u8(static_cast<uint8_t>(v >> (8 * i)));
}

void ByteWriter::put_u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) put_u8(static_cast<uint8_t>(v >> (8 * i)));
}

void ByteWriter::put_f32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  put_u32(bits);
}

void ByteWriter::put_raw(const void* data, size_t size) {
  if (size == 0) return;
  const auto* p = static_cast<const uint8_t*>(data);
  buffer_.insert(buffer_.end(), p, p + size);
}

void ByteWriter::put_length(size_t length, const char* what) {
  if (length > std::numeric_limits<uint32_t>::max()) {
    if (status_.is_ok())
      status_ = make_status(StatusCode::kInvalidArgument,
                            "%s of %zu bytes is too long for the engine format "
                            "(limit 4 GiB)",
                            what, length);
    put_u32(0);
    return;
  }
  put_u32(static_cast<uint32_t>(length));
}

void ByteWriter::put_string(const std::string& s) {
  put_length(s.size(), "string");
  if (s.size() <= std::numeric_limits<uint32_t>::max()) put_raw(s.data(), s.size());
}

void ByteWriter::put_bytes(const std::vector<uint8_t>& bytes) {
  put_length(bytes.size(), "byte array");
  if (bytes.size() <= std::numeric_limits<uint32_t>::max())
    put_raw(bytes.data(), bytes.size());
}

void ByteWriter::pad_to(size_t alignment) {
  while (buffer_.size() % alignment != 0) buffer_.push_back(0);
}

void ByteWriter::patch_u32(size_t offset, uint32_t v) {
  if (offset > buffer_.size() || buffer_.size() - offset < 4) return;
  for (int i = 0; i < 4; ++i) buffer_[offset + i] = static_cast<uint8_t>(v >> (8 * i));
}

void ByteWriter::patch_u64(size_t offset, uint64_t v) {
  if (offset > buffer_.size() || buffer_.size() - offset < 8) return;
  for (int i = 0; i < 8; ++i) buffer_[offset + i] = static_cast<uint8_t>(v >> (8 * i));
}

// ---- ByteReader ------------------------------------------------------------

Status ByteReader::need(size_t n) const {
  if (n <= remaining()) return Status::ok();
  return make_status(StatusCode::kCorruptData,
                     "read past end of section '%s' (offset %zu, need %zu, have %zu)",
                     section_, offset_, n, remaining());
}

uint64_t ByteReader::take_le(size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(data_[offset_ + i]) << (8 * i);
  offset_ += n;
  return v;
}

Status ByteReader::read_u8(uint8_t* out) {
  KILN_RETURN_IF_ERROR(need(1));
  *out = static_cast<uint8_t>(take_le(1));
  return Status::ok();
}

Status ByteReader::read_u16(uint16_t* out) {
  KILN_RETURN_IF_ERROR(need(2));
  *out = static_cast<uint16_t>(take_le(2));
  return Status::ok();
}

Status ByteReader::read_u32(uint32_t* out) {
  KILN_RETURN_IF_ERROR(need(4));
  *out = static_cast<uint32_t>(take_le(4));
  return Status::ok();
}

Status ByteReader::read_u64(uint64_t* out) {
  KILN_RETURN_IF_ERROR(need(8));
  *out = take_le(8);
  return Status::ok();
}

Status ByteReader::read_i64(int64_t* out) {
  uint64_t v = 0;
  KILN_RETURN_IF_ERROR(read_u64(&v));
  *out = static_cast<int64_t>(v);
  return Status::ok();
}

Status ByteReader::read_f32(float* out) {
  uint32_t bits = 0;
  KILN_RETURN_IF_ERROR(read_u32(&bits));
  std::memcpy(out, &bits, sizeof(bits));
  return Status::ok();
}

Status ByteReader::read_bool(bool* out) {
  KILN_RETURN_IF_ERROR(need(1));
  uint8_t v = data_[offset_];
  if (v > 1)
    return make_status(StatusCode::kCorruptData,
                       "bool byte %u at offset %zu of section '%s' is not 0 or 1",
                       static_cast<unsigned>(v), offset_, section_);
  offset_ += 1;
  *out = v != 0;
  return Status::ok();
}

Status ByteReader::read_string(std::string* out) {
  KILN_RETURN_IF_ERROR(need(4));
  size_t start = offset_;
  uint32_t length = static_cast<uint32_t>(take_le(4));
  Status status = need(length);
  if (!status.is_ok()) {
    offset_ = start;
    return add_context(status, "string of %u bytes", length);
  }
  out->assign(reinterpret_cast<const char*>(data_ + offset_), length);
  offset_ += length;
  return Status::ok();
}

Status ByteReader::read_bytes(std::vector<uint8_t>* out) {
  KILN_RETURN_IF_ERROR(need(4));
  size_t start = offset_;
  uint32_t length = static_cast<uint32_t>(take_le(4));
  Status status = need(length);
  if (!status.is_ok()) {
    offset_ = start;
    return add_context(status, "byte array of %u bytes", length);
  }
  out->assign(data_ + offset_, data_ + offset_ + length);
  offset_ += length;
  return Status::ok();
}

Status ByteReader::read_count(uint32_t* out, size_t min_element_bytes) {
  KILN_RETURN_IF_ERROR(need(4));
  size_t start = offset_;
  uint32_t count = static_cast<uint32_t>(take_le(4));
  size_t per = min_element_bytes == 0 ? 1 : min_element_bytes;
  size_t available = remaining();
  if (count > available / per) {
    offset_ = start;
    return make_status(StatusCode::kCorruptData,
                       "count %u at offset %zu of section '%s' cannot fit in the "
                       "remaining %zu bytes (each element needs at least %zu)",
                       count, start, section_, available, per);
  }
  *out = count;
  return Status::ok();
}

Status ByteReader::skip(size_t n) {
  KILN_RETURN_IF_ERROR(need(n));
  offset_ += n;
  return Status::ok();
}

Status ByteReader::read_span(size_t n, const uint8_t** out) {
  KILN_RETURN_IF_ERROR(need(n));
  *out = data_ + offset_;
  offset_ += n;
  return Status::ok();
}

Status ByteReader::expect_end() const {
  if (remaining() == 0) return Status::ok();
  return make_status(StatusCode::kCorruptData,
                     "%zu unexpected trailing bytes at offset %zu of section '%s'",
                     remaining(), offset_, section_);
}

// ---- helpers ---------------------------------------------------------------

uint32_t load_le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

uint64_t load_le64(const uint8_t* p) {
  return static_cast<uint64_t>(load_le32(p)) | static_cast<uint64_t>(load_le32(p + 4)) << 32;
}

Status add_context(const Status& status, const char* format, ...) {
  if (status.is_ok()) return status;
  va_list args;
  va_start(args, format);
  char buffer[256];
  int n = std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  if (n < 0) return status;
  return status.with_context(buffer);  // contexts are short; truncation is fine
}

}  // namespace kiln::engine
