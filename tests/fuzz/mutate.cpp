#include "mutate.h"

#include <cstring>

namespace kiln::fuzz {
namespace {

size_t pick_position(Rng* rng, size_t size, Focus focus) {
  if (focus.end > focus.begin && focus.end <= size && rng->below(2) == 0)
    return focus.begin + rng->below(focus.end - focus.begin);
  return rng->below(size);
}

// Values that break length and index fields: 0, -1, sign bits, off by one.
constexpr uint32_t kInteresting[] = {0u,          1u,          0x7fu,        0x80u,
                                     0xffu,       0x100u,      0x7fffu,      0x8000u,
                                     0xffffu,     0x10000u,    0x7fffffffu,  0x80000000u,
                                     0xfffffffeu, 0xffffffffu, 0x40u,        0x3fu};

}  // namespace

std::string mutate(std::vector<uint8_t>* bytes, Rng* rng, Focus focus, bool allow_truncate) {
  std::vector<uint8_t>& b = *bytes;
  const size_t size = b.size();
  const uint64_t kinds = allow_truncate ? 6 : 5;
  switch (rng->below(kinds)) {
    case 0:
    case 1:
    case 2: {  // 1, 8 or 64 bit flips
      static constexpr int kFlips[] = {1, 8, 64};
      const int flips = kFlips[rng->below(3)];
      for (int i = 0; i < flips; ++i) b[pick_position(rng, size, focus)] ^= 1u << rng->below(8);
      return "flip" + std::to_string(flips);
    }
    case 3: {  // overwrite 1-16 bytes with random bytes, 0x00 or 0xff
      const size_t at = pick_position(rng, size, focus);
      const size_t n = std::min<size_t>(1 + rng->below(16), size - at);
      const uint64_t fill = rng->below(3);
      for (size_t i = 0; i < n; ++i)
        b[at + i] = fill == 0 ? static_cast<uint8_t>(rng->next()) : fill == 1 ? 0x00 : 0xff;
      return "overwrite" + std::to_string(n) + "@" + std::to_string(at);
    }
    case 4: {  // a 4-byte-aligned little-endian field set to a boundary value
      size_t at = pick_position(rng, size, focus) & ~size_t{3};
      if (at + 4 > size) at = size >= 4 ? size - 4 : 0;
      uint32_t value = kInteresting[rng->below(sizeof(kInteresting) / sizeof(kInteresting[0]))];
      if (rng->below(4) == 0) {  // or the old value plus or minus a little
        uint32_t old = 0;
        std::memcpy(&old, b.data() + at, std::min<size_t>(4, size - at));
        value = old + static_cast<uint32_t>(rng->below(17)) - 8u;
      }
      std::memcpy(b.data() + at, &value, std::min<size_t>(4, size - at));
      return "field@" + std::to_string(at);
    }
    default: {  // truncate (half the time inside the focus range)
      const size_t keep = pick_position(rng, size, focus);
      b.resize(keep);
      return "truncate@" + std::to_string(keep);
    }
  }
}

}  // namespace kiln::fuzz
