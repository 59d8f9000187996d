// The variant set (engine_format/variant_set.h): the delegate blob of a
// partition exported with dynamic shapes. Round trip, and every corruption
// the reader must refuse rather than trust.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine_format/variant_set.h"

namespace kiln::engine {
namespace {

std::vector<uint8_t> random_engine(std::mt19937& rng, size_t size) {
  std::vector<uint8_t> bytes(size);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

VariantSetDesc two_symbols() {
  VariantSetDesc desc;
  desc.symbols = {{"s0", 1, 512}, {"s7", 2, 8}};
  desc.bindings = {{0, 1, 0}, {1, 0, 0}, {2, 3, 1}};
  desc.values = {{1, 2}, {64, 2}, {512, 8}};
  return desc;
}

TEST(VariantSet, RoundTripKeepsShapesAndEngineBytes) {
  std::mt19937 rng(std::random_device{}());
  const VariantSetDesc desc = two_symbols();
  std::vector<std::vector<uint8_t>> engines;
  for (size_t v = 0; v < desc.values.size(); ++v) engines.push_back(random_engine(rng, 1 + rng() % 300));
  Result<std::vector<uint8_t>> blob = serialize_variant_set(desc, engines);
  ASSERT_TRUE(blob.is_ok()) << blob.status().to_string();
  EXPECT_TRUE(is_variant_set(blob->data(), blob->size()));
  EXPECT_FALSE(is_variant_set(engines[0].data(), 4));

  VariantSetDesc got;
  std::vector<VariantEngine> parts;
  ASSERT_TRUE(parse_variant_set(blob->data(), blob->size(), &got, &parts).is_ok());
  ASSERT_EQ(got.symbols.size(), desc.symbols.size());
  for (size_t s = 0; s < desc.symbols.size(); ++s) {
    EXPECT_EQ(got.symbols[s].name, desc.symbols[s].name);
    EXPECT_EQ(got.symbols[s].min, desc.symbols[s].min);
    EXPECT_EQ(got.symbols[s].max, desc.symbols[s].max);
  }
  ASSERT_EQ(got.bindings.size(), desc.bindings.size());
  for (size_t b = 0; b < desc.bindings.size(); ++b) {
    EXPECT_EQ(got.bindings[b].input, desc.bindings[b].input);
    EXPECT_EQ(got.bindings[b].dim, desc.bindings[b].dim);
    EXPECT_EQ(got.bindings[b].symbol, desc.bindings[b].symbol);
  }
  EXPECT_EQ(got.values, desc.values);
  ASSERT_EQ(parts.size(), engines.size());
  for (size_t v = 0; v < engines.size(); ++v) {
    ASSERT_EQ(parts[v].size, engines[v].size());
    EXPECT_EQ(std::memcmp(parts[v].data, engines[v].data(), engines[v].size()), 0) << "variant " << v;
    EXPECT_EQ((parts[v].data - blob->data()) % 16, 0) << "engines start 16-byte aligned";
  }
  EXPECT_EQ(describe_symbol(got, 0), "s0 in [1, 512] (input 0 dim 1, input 1 dim 0)");
}

TEST(VariantSet, WriterRefusesAnInconsistentDescription) {
  const std::vector<std::vector<uint8_t>> three(3, std::vector<uint8_t>(8, 1));
  VariantSetDesc desc = two_symbols();
  desc.values[1][0] = 513;  // outside s0's range
  EXPECT_FALSE(serialize_variant_set(desc, three).is_ok());
  desc = two_symbols();
  desc.bindings[2].symbol = 2;  // no such symbol
  EXPECT_FALSE(serialize_variant_set(desc, three).is_ok());
  desc = two_symbols();
  EXPECT_FALSE(serialize_variant_set(desc, {three[0], three[1]}).is_ok()) << "one engine per variant";
  desc.symbols[1].max = 1;  // max < min
  EXPECT_FALSE(serialize_variant_set(desc, three).is_ok());
}

TEST(VariantSet, EveryTruncationAndFlippedCountFails) {
  std::mt19937 rng(std::random_device{}());
  const VariantSetDesc desc = two_symbols();
  std::vector<std::vector<uint8_t>> engines;
  for (size_t v = 0; v < desc.values.size(); ++v) engines.push_back(random_engine(rng, 40));
  Result<std::vector<uint8_t>> blob = serialize_variant_set(desc, engines);
  ASSERT_TRUE(blob.is_ok());
  VariantSetDesc got;
  std::vector<VariantEngine> parts;
  for (size_t n = 0; n < blob->size(); ++n) {
    // The last engine ends the blob: any shorter blob misses some of it.
    EXPECT_FALSE(parse_variant_set(blob->data(), n, &got, &parts).is_ok()) << "truncated to " << n;
  }
  // Every single byte of the header changed to another value: refused, or
  // (a name's letter, a value still in range) parsed into a consistent set
  // whose engines stay inside the blob.
  ASSERT_TRUE(parse_variant_set(blob->data(), blob->size(), &got, &parts).is_ok());
  const size_t header_end = static_cast<size_t>(parts[0].data - blob->data());
  for (size_t at = 0; at < header_end; ++at) {
    std::vector<uint8_t> bad = blob.value();
    bad[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    VariantSetDesc d;
    std::vector<VariantEngine> p;
    if (!parse_variant_set(bad.data(), bad.size(), &d, &p).is_ok()) continue;
    for (const VariantEngine& e : p) {
      EXPECT_GE(e.data, bad.data()) << "byte " << at;
      EXPECT_LE(e.data + e.size, bad.data() + bad.size()) << "byte " << at;
    }
    for (size_t v = 0; v < d.values.size(); ++v)
      for (size_t s = 0; s < d.symbols.size(); ++s) {
        EXPECT_GE(d.values[v][s], d.symbols[s].min) << "byte " << at;
        EXPECT_LE(d.values[v][s], d.symbols[s].max) << "byte " << at;
      }
  }
}

// Alternatives (version 2): a static partition's engines in order of preference (no symbols), and
// equal values in a dynamic set.
TEST(VariantSet, AlternativesRoundTripWithOrWithoutSymbols) {
  std::mt19937 rng(std::random_device{}());
  VariantSetDesc fixed;
  fixed.values = {{}, {}};
  std::vector<std::vector<uint8_t>> engines = {random_engine(rng, 33), random_engine(rng, 70)};
  Result<std::vector<uint8_t>> blob = serialize_variant_set(fixed, engines);
  ASSERT_TRUE(blob.is_ok()) << blob.status().to_string();
  VariantSetDesc got;
  std::vector<VariantEngine> parts;
  ASSERT_TRUE(parse_variant_set(blob->data(), blob->size(), &got, &parts).is_ok());
  EXPECT_TRUE(got.symbols.empty());
  EXPECT_EQ(got.values, fixed.values);
  ASSERT_EQ(parts.size(), 2u);
  for (size_t v = 0; v < 2; ++v)
    EXPECT_EQ(std::vector<uint8_t>(parts[v].data, parts[v].data + parts[v].size), engines[v]) << "engine " << v;

  VariantSetDesc dynamic = two_symbols();
  dynamic.values.insert(dynamic.values.begin() + 2, dynamic.values[1]);  // variant 1 and its alternative
  engines.clear();
  for (size_t v = 0; v < dynamic.values.size(); ++v) engines.push_back(random_engine(rng, 20 + v));
  blob = serialize_variant_set(dynamic, engines);
  ASSERT_TRUE(blob.is_ok()) << blob.status().to_string();
  ASSERT_TRUE(parse_variant_set(blob->data(), blob->size(), &got, &parts).is_ok());
  EXPECT_EQ(got.values, dynamic.values);

  fixed.bindings = {{0, 1, 0}};  // a binding needs a symbol
  EXPECT_FALSE(serialize_variant_set(fixed, {engines[0], engines[1]}).is_ok());
}

// two_symbols()'s set of three engines serialized, its header's version byte then set to `version`.
std::vector<uint8_t> two_symbols_blob_as_version(uint8_t version) {
  const std::vector<std::vector<uint8_t>> three(3, std::vector<uint8_t>(8, 1));
  Result<std::vector<uint8_t>> blob = serialize_variant_set(two_symbols(), three);
  EXPECT_TRUE(blob.is_ok());
  std::vector<uint8_t> bytes = blob.is_ok() ? blob.value() : std::vector<uint8_t>{};
  if (bytes.size() > 8) bytes[8] = version;
  return bytes;
}

// Version 1 (before alternatives) still reads.
TEST(VariantSet, VersionOneStillReads) {
  const VariantSetDesc desc = two_symbols();
  const std::vector<uint8_t> old = two_symbols_blob_as_version(1);
  ASSERT_GT(old.size(), 8u);
  VariantSetDesc got;
  std::vector<VariantEngine> parts;
  EXPECT_TRUE(parse_variant_set(old.data(), old.size(), &got, &parts).is_ok());
  EXPECT_EQ(got.values, desc.values);
}

TEST(VariantSet, OtherVersionAsksForARebuild) {
  const std::vector<uint8_t> bad = two_symbols_blob_as_version(static_cast<uint8_t>(kVariantSetVersion + 1));
  ASSERT_GT(bad.size(), 8u);
  VariantSetDesc got;
  std::vector<VariantEngine> parts;
  const Status status = parse_variant_set(bad.data(), bad.size(), &got, &parts);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.to_string().find("rebuild"), std::string::npos) << status.to_string();
}

}  // namespace
}  // namespace kiln::engine
