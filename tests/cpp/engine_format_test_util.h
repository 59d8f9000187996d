// Helpers the engine format tests share (engine_format_test.cpp,
// engine_validate_test.cpp): a seeded RNG printed with every failure, a small
// but complete engine, exact comparison, and byte surgery on serialized
// engines (sections, checksums).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine_format/engine_format.h"
#include "engine_format/engine_layout.h"

namespace kiln::engine::format_test {

// KILN_TEST_SEED when set, else a random seed.
uint32_t test_seed();

// Declares `rng`, seeded, with the seed in every failure message of the test.
#define SEEDED_RNG(rng)                                                        \
  const uint32_t rng##_seed = ::kiln::engine::format_test::test_seed();            \
  SCOPED_TRACE(::testing::Message() << "KILN_TEST_SEED=" << rng##_seed);       \
  std::mt19937 rng(rng##_seed)

inline bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

#define EXPECT_MESSAGE_HAS(status, sub) \
  EXPECT_TRUE(::kiln::engine::format_test::contains((status).message(), sub)) << "message: " << (status).message()

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n);

// A small MLP block: y = gelu(x @ W^T + b), fp16, with real-looking parts.
// `cubin_bytes` scales the module images (small engines keep the exhaustive
// bit-flip test fast).
EngineDesc make_engine(std::mt19937& rng, size_t cubin_bytes = 1024);

// Format v6 parts on a make_engine() engine: a 1024-byte derived weight
// "fc.weight.packed" made by three copies from fc.weight (tensor 1, reading
// only its first 512 bytes), a tensor viewing it (appended last), and the
// kernel step made persistent (min_blocks 1).
void add_derived_weight(EngineDesc& d);

// Every field of `a` and `b` equal (GoogleTest failures naming the field).
void expect_desc_eq(const EngineDesc& a, const EngineDesc& b);

// serialize_engine's bytes, failing the test when it refuses.
std::vector<uint8_t> serialize_ok(const EngineDesc& d);

// Parses the first `len` bytes from a heap block of exactly that size, so
// ASan flags any read past the end.
Result<EngineDesc> parse_exact(const std::vector<uint8_t>& bytes, size_t len);

void put32(std::vector<uint8_t>& b, size_t at, uint32_t v);
void put64(std::vector<uint8_t>& b, size_t at, uint64_t v);

struct SectionSpan {
  size_t entry = 0, offset = 0, size = 0;  // entry: its table entry's offset
};
// Where section `kind` lies in serialized bytes.
SectionSpan find_section(const std::vector<uint8_t>& b, layout::SectionKind kind);

// Recomputes every checksum after a test edited the bytes, so parsing gets
// past the CRCs to the checks behind them.
void reseal(std::vector<uint8_t>& b);

}  // namespace kiln::engine::format_test
