#include "tensor_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

namespace kiln::tools {

using engine::DType;

namespace {

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensor files are little-endian; this reader assumes a little-endian host"
#endif

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'T', 'N', 'S', '1'};
// dtype u8, rank u8, reserved u16 and nbytes u64: the least a tensor takes.
constexpr size_t kTensorMinBytes = 12;

// Bounds-checked little-endian reader over a file's bytes.
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  size_t remaining() const { return bytes_.size() - pos_; }
  size_t position() const { return pos_; }
  template <typename T>
  bool read(T* out) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool read_bytes(size_t n, std::vector<uint8_t>* out) {
    if (remaining() < n) return false;
    out->assign(bytes_.begin() + pos_, bytes_.begin() + pos_ + n);
    pos_ += n;
    return true;
  }

 private:
  const std::vector<uint8_t>& bytes_;
  size_t pos_ = 0;
};

Status corrupt(const std::string& path, const std::string& what) {
  return Status(StatusCode::kCorruptData, "tensor file '" + path + "': " + what);
}

template <typename T>
void append(std::vector<uint8_t>* out, T value) {
  const auto* p = reinterpret_cast<const uint8_t*>(&value);
  out->insert(out->end(), p, p + sizeof(T));
}

}  // namespace

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string describe_tensor(DType dtype, const std::vector<int64_t>& shape) {
  std::string text = engine::dtype_name(dtype);
  text += " [";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

Result<std::vector<HostTensor>> read_tensor_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    return Status(StatusCode::kInvalidArgument,
                  "cannot open tensor file '" + path + "': " + std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)),
                             std::istreambuf_iterator<char>());
  if (file.bad())
    return Status(StatusCode::kInvalidArgument, "cannot read tensor file '" + path + "'");

  Reader reader(bytes);
  char magic[8];
  if (bytes.size() < sizeof(magic)) return corrupt(path, "shorter than the 8-byte magic");
  for (char& c : magic) (void)reader.read(&c);
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0)
    return corrupt(path, "bad magic (expected \"KILNTNS1\"): not a .ktensors file");
  uint32_t count = 0;
  if (!reader.read(&count)) return corrupt(path, "ends before the tensor count");
  if (count > kMaxTensorFileCount || count * kTensorMinBytes > reader.remaining())
    return corrupt(path, "tensor count " + std::to_string(count) + " is out of range for a " +
                             std::to_string(bytes.size()) + "-byte file");

  std::vector<HostTensor> tensors(count);
  for (uint32_t i = 0; i < count; ++i) {
    const std::string where = "tensor " + std::to_string(i) + " (at byte " +
                              std::to_string(reader.position()) + ")";
    HostTensor& t = tensors[i];
    uint8_t dtype = 0, rank = 0;
    uint16_t reserved = 0;
    if (!reader.read(&dtype) || !reader.read(&rank) || !reader.read(&reserved))
      return corrupt(path, where + ": file ends inside the header");
    if (dtype >= engine::kDTypeCount)
      return corrupt(path, where + ": dtype " + std::to_string(dtype) + " is not one of 0..5");
    if (rank > engine::kMaxRank)
      return corrupt(path, where + ": rank " + std::to_string(rank) + " exceeds " +
                               std::to_string(engine::kMaxRank));
    t.dtype = static_cast<DType>(dtype);
    t.shape.resize(rank);
    uint64_t numel = 1;
    bool overflow = false;
    for (uint8_t d = 0; d < rank; ++d) {
      if (!reader.read(&t.shape[d])) return corrupt(path, where + ": file ends inside the dims");
      if (t.shape[d] < 0)
        return corrupt(path, where + ": dim " + std::to_string(d) + " is negative (" +
                                 std::to_string(t.shape[d]) + ")");
      const uint64_t dim = static_cast<uint64_t>(t.shape[d]);
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
      numel *= dim;
    }
    const uint64_t element = engine::dtype_size(t.dtype);
    if (overflow || numel > std::numeric_limits<uint64_t>::max() / element)
      return corrupt(path, where + ": element count overflows");
    uint64_t nbytes = 0;
    if (!reader.read(&nbytes)) return corrupt(path, where + ": file ends before nbytes");
    const std::string desc = describe_tensor(t.dtype, t.shape);
    if (nbytes != numel * element)
      return corrupt(path, where + " " + desc + ": nbytes " + std::to_string(nbytes) +
                               " does not match the dims (" + std::to_string(numel * element) +
                               " expected)");
    if (nbytes > reader.remaining())
      return corrupt(path, where + " " + desc + ": file ends early (" +
                               std::to_string(nbytes) + " data bytes needed, " +
                               std::to_string(reader.remaining()) + " left)");
    (void)reader.read_bytes(static_cast<size_t>(nbytes), &t.data);
  }
  if (reader.remaining() != 0)
    return corrupt(path, std::to_string(reader.remaining()) +
                             " unexpected bytes after the last tensor");
  return tensors;
}

Status write_tensor_file(const std::string& path, const std::vector<HostTensor>& tensors) {
  if (tensors.size() > kMaxTensorFileCount)
    return make_status(StatusCode::kInvalidArgument, "too many tensors (%zu) for a tensor file",
                       tensors.size());
  // Check everything first so a bad tensor never leaves a half-written file.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const HostTensor& t = tensors[i];
    const uint64_t expected = static_cast<uint64_t>(t.numel()) * engine::dtype_size(t.dtype);
    if (t.shape.size() > engine::kMaxRank || t.data.size() != expected)
      return make_status(StatusCode::kInvalidArgument,
                         "tensor file '%s': tensor %zu (%s) has rank %zu and %zu bytes; "
                         "expected rank <= %u and %llu bytes",
                         path.c_str(), i, describe_tensor(t.dtype, t.shape).c_str(),
                         t.shape.size(), t.data.size(), engine::kMaxRank,
                         static_cast<unsigned long long>(expected));
  }
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file)
    return Status(StatusCode::kInvalidArgument,
                  "cannot create tensor file '" + path + "': " + std::strerror(errno));
  std::vector<uint8_t> header(kMagic, kMagic + sizeof(kMagic));
  append(&header, static_cast<uint32_t>(tensors.size()));
  file.write(reinterpret_cast<const char*>(header.data()), header.size());
  for (const HostTensor& t : tensors) {
    header.clear();
    append(&header, static_cast<uint8_t>(t.dtype));
    append(&header, static_cast<uint8_t>(t.shape.size()));
    append(&header, static_cast<uint16_t>(0));
    for (int64_t d : t.shape) append(&header, d);
    append(&header, static_cast<uint64_t>(t.data.size()));
    file.write(reinterpret_cast<const char*>(header.data()), header.size());
    file.write(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  }
  file.flush();
  if (!file)
    return Status(StatusCode::kInternal, "writing tensor file '" + path + "' failed");
  return Status::ok();
}

}  // namespace kiln::tools
