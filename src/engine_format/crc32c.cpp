// CRC-32C (Castagnoli), reflected polynomial 0x82F63B78, in software.
//
// Slicing-by-8: eight 256-entry tables let the loop fold 8 input bytes per
// iteration with independent lookups, several times faster than the
// byte-at-a-time loop; weights sections can be hundreds of MB and are
// checksummed on every load. Tables are built at compile time.
#include <cstdint>

#include "engine_format/engine_format.h"

namespace kiln::engine {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

struct Tables {
  uint32_t t[8][256];
};

constexpr Tables make_tables() {
  Tables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (kPoly & (0u - (crc & 1u)));
    tables.t[0][i] = crc;
  }
  // t[k][i]: the CRC of byte i followed by k zero bytes.
  for (int k = 1; k < 8; ++k)
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t prev = tables.t[k - 1][i];
      tables.t[k][i] = (prev >> 8) ^ tables.t[0][prev & 0xffu];
    }
  return tables;
}

constexpr Tables kTables = make_tables();

inline uint32_t load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace

// `seed` is a previous result, so crc32c(b, nb, crc32c(a, na)) equals the CRC
// of a followed by b.
uint32_t crc32c(const void* data, size_t size, uint32_t seed) {
  const auto& t = kTables.t;
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t crc = ~seed;
  while (size >= 8) {
    uint32_t lo = crc ^ load32(p);
    uint32_t hi = load32(p + 4);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^
          t[4][lo >> 24] ^ t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^
          t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size > 0) {
    crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xff];
    ++p;
    --size;
  }
  return ~crc;
}

}  // namespace kiln::engine
