#include "codegen/kernel_disk_cache.h"

#include <nvJitLink.h>
#include <nvrtc.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "codegen/sha256.h"
#include "engine_format/engine_format.h"

namespace kiln::codegen {
namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'K', 'C', '0', '1'};
constexpr size_t kHeader = 8 + 8 + 4;  // magic, payload size, CRC-32C

std::string toolkit_versions() {
  int major = 0, minor = 0;
  std::string text = "nvrtc ";
  if (nvrtcVersion(&major, &minor) == NVRTC_SUCCESS) text += std::to_string(major) + "." + std::to_string(minor);
  unsigned link_major = 0, link_minor = 0;
  text += " nvjitlink ";
  if (nvJitLinkVersion(&link_major, &link_minor) == NVJITLINK_SUCCESS)
    text += std::to_string(link_major) + "." + std::to_string(link_minor);
  return text;
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out += char(uint8_t(v >> (8 * i)));
}
void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += char(uint8_t(v >> (8 * i)));
}
uint64_t get_u64(const std::string& in, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | uint8_t(in[at + i]);
  return v;
}
uint32_t get_u32(const std::string& in, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | uint8_t(in[at + i]);
  return v;
}

std::filesystem::path entry_path(const std::string& dir, const std::string& key) {
  return std::filesystem::path(dir) / (key + ".kc");
}

}  // namespace

std::string kernel_cache_dir() {
  const char* env = std::getenv("KILN_KERNEL_CACHE");
  return env ? std::string(env) : std::string();
}

std::string kernel_cache_key(const std::string& what, const std::string& name, const std::string& source) {
  static const std::string versions = toolkit_versions();
  Sha256 hash;
  // Bumping the first string drops every entry (a change in how Kiln calls
  // NVRTC or nvJitLink that the key does not otherwise show).
  for (const std::string* part : {&versions, &what, &name, &source}) {
    hash.update(*part);
    hash.update("\0", 1);
  }
  hash.update("kiln kernel cache 1");
  return hash.hex();
}

std::optional<std::string> kernel_cache_read(const std::string& dir, const std::string& key) {
  std::ifstream in(entry_path(dir, key), std::ios::binary);
  if (!in) return std::nullopt;
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.size() < kHeader || data.compare(0, 8, kMagic, 8) != 0) return std::nullopt;
  const uint64_t size = get_u64(data, 8);
  if (size != data.size() - kHeader) return std::nullopt;
  std::string payload = data.substr(kHeader);
  if (engine::crc32c(payload.data(), payload.size()) != get_u32(data, 16)) return std::nullopt;
  return payload;
}

bool kernel_cache_write(const std::string& dir, const std::string& key, const std::string& payload) {
  static std::atomic<uint64_t> counter{0};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return false;
  std::string data(kMagic, 8);
  put_u64(data, payload.size());
  put_u32(data, engine::crc32c(payload.data(), payload.size()));
  data += payload;
  const std::filesystem::path final_path = entry_path(dir, key);
  const std::filesystem::path tmp =
      final_path.string() + ".tmp" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!out) {
      out.close();
      std::filesystem::remove(tmp, ec);
      return false;
    }
  }
  std::filesystem::rename(tmp, final_path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return false;
  }
  return true;
}

}  // namespace kiln::codegen
