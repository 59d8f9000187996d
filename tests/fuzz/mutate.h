// Deterministic mutations of whole files for the fuzz harness: bit flips
// (1, 8, 64 bits), truncations and byte overwrites, each drawn from a seeded
// generator so that a case number reproduces the same bytes on any machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::fuzz {

// splitmix64: the generator behind every choice (portable, unlike the
// distributions of <random>, whose output differs between standard libraries).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n); n > 0.
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t state_;
};

// The seed of case `index` of a run seeded with `seed`.
inline uint64_t case_seed(uint64_t seed, uint64_t index) {
  Rng rng(seed ^ (index * 0xd1342543de82ef95ULL));
  return rng.next();
}

// A byte range mutations prefer (half of the positions fall in it): the
// flatbuffer of a .pte, one section of an engine. Empty: the whole file.
struct Focus {
  size_t begin = 0;
  size_t end = 0;
};

// Applies one mutation, chosen by `rng`, to `bytes` (at least 1 byte long)
// and returns its description ("flip8", "truncate@123", ...).
// `allow_truncate` false keeps the size (engine mutations that are re-sealed).
std::string mutate(std::vector<uint8_t>* bytes, Rng* rng, Focus focus, bool allow_truncate);

}  // namespace kiln::fuzz
