// Engine format tests: round trip, determinism, CRC-32C, byte_io and
// corruption handling (truncation, bit flips, re-checksummed garbage);
// validate_engine, named weights and states: engine_validate_test.cpp.
//
// Random data comes from a seed printed with every failure; set KILN_TEST_SEED
// to replay one.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine_format/byte_io.h"
#include "engine_format/engine_format.h"
#include "engine_format/engine_layout.h"
#include "engine_format_test_util.h"

namespace kiln::engine {
namespace {

namespace L = layout;
using namespace format_test;  // NOLINT: the shared test helpers

// ---- CRC-32C ---------------------------------------------------------------

uint32_t crc32c_bitwise(const uint8_t* p, size_t n) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0);
  }
  return ~crc;
}

TEST(Crc32c, StandardCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  // RFC 3720 (iSCSI) appendix B.4 vectors.
  std::vector<uint8_t> v(32, 0);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x8A9136AAu);
  std::fill(v.begin(), v.end(), 0xff);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) v[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) v[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x113FDB5Cu);
}

TEST(Crc32c, SlicingMatchesBitwiseAndChains) {
  SEEDED_RNG(rng);
  std::vector<uint8_t> data = random_bytes(rng, 4096);
  for (int iter = 0; iter < 300; ++iter) {
    size_t start = rng() % 64, len = rng() % (data.size() - start);
    const uint8_t* p = data.data() + start;
    uint32_t expected = crc32c_bitwise(p, len);
    ASSERT_EQ(crc32c(p, len), expected) << "start " << start << " len " << len;
    size_t split = len == 0 ? 0 : rng() % len;
    ASSERT_EQ(crc32c(p + split, len - split, crc32c(p, split)), expected) << "split " << split;
  }
}

// ---- byte_io ---------------------------------------------------------------

TEST(ByteIo, WriterReaderRoundTrip) {
  ByteWriter w;
  w.put_u8(0xab);
  w.put_u16(0xbeef);
  w.put_u32(0xdeadbeef);
  w.put_u64(0x0123456789abcdefull);
  w.put_i64(-5);
  w.put_f32(-1.5f);
  w.put_string("hello");
  w.put_bytes({1, 2, 3});
  w.pad_to(64);
  ASSERT_TRUE(w.status().is_ok());
  ASSERT_EQ(w.size(), 64u);
  EXPECT_EQ(w.buffer()[1], 0xef);  // little-endian
  EXPECT_EQ(w.buffer()[2], 0xbe);

  ByteReader r(w.buffer().data(), w.size(), "test");
  uint8_t u8 = 0;
  uint16_t u16 = 0;
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  int64_t i64 = 0;
  float f = 0;
  std::string s;
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(r.read_u8(&u8).is_ok());
  ASSERT_TRUE(r.read_u16(&u16).is_ok());
  ASSERT_TRUE(r.read_u32(&u32).is_ok());
  ASSERT_TRUE(r.read_u64(&u64).is_ok());
  ASSERT_TRUE(r.read_i64(&i64).is_ok());
  ASSERT_TRUE(r.read_f32(&f).is_ok());
  ASSERT_TRUE(r.read_string(&s).is_ok());
  ASSERT_TRUE(r.read_bytes(&bytes).is_ok());
  EXPECT_EQ(u8, 0xab);
  EXPECT_EQ(u16, 0xbeef);
  EXPECT_EQ(u32, 0xdeadbeefu);
  EXPECT_EQ(u64, 0x0123456789abcdefull);
  EXPECT_EQ(i64, -5);
  EXPECT_EQ(f, -1.5f);
  EXPECT_EQ(s, "hello");
  EXPECT_EQ(bytes, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_FALSE(r.expect_end().is_ok());
  ASSERT_TRUE(r.skip(r.remaining()).is_ok());
  EXPECT_TRUE(r.expect_end().is_ok());
}

TEST(ByteIo, ReadPastEndNamesWhatAndWhere) {
  std::vector<uint8_t> buf(124, 0);
  ByteReader r(buf.data(), buf.size(), "tensors");
  ASSERT_TRUE(r.skip(120).is_ok());
  auto read_dim = [&]() -> Status {
    int64_t dim = 0;
    KILN_READ_OR_RETURN(r.read_i64(&dim), "tensor %u shape dim %u", 3u, 1u);
    return Status::ok();
  };
  Status st = read_dim();
  EXPECT_EQ(st.code(), StatusCode::kCorruptData);
  EXPECT_EQ(st.message(),
            "tensor 3 shape dim 1: read past end of section 'tensors' (offset 120, need 8, have 4)");
  EXPECT_EQ(r.offset(), 120u);  // a failed read consumes nothing
}

TEST(ByteIo, RejectsAbsurdCountsAndLengthsBeforeAllocating) {
  ByteWriter w;
  w.put_u32(0xffffffffu);  // count / length
  w.put_u64(0);
  ByteReader r(w.buffer().data(), w.size(), "steps");
  uint32_t count = 0;
  Status st = r.read_count(&count, 4);
  EXPECT_EQ(st.code(), StatusCode::kCorruptData);
  EXPECT_MESSAGE_HAS(st, "count 4294967295");
  std::string s;
  EXPECT_FALSE(r.read_string(&s).is_ok());
  std::vector<uint8_t> v;
  EXPECT_FALSE(r.read_bytes(&v).is_ok());
  EXPECT_EQ(r.offset(), 0u);
  ASSERT_TRUE(r.skip(4).is_ok());
  EXPECT_TRUE(r.read_count(&count, 4).is_ok());  // 0 fits
  uint8_t two = 2;
  ByteReader rb(&two, 1, "meta");
  bool flag = false;
  EXPECT_FALSE(rb.read_bool(&flag).is_ok());
}

// ---- round trip --------------------------------------------------------------

TEST(EngineFormat, DtypeTable) {
  EXPECT_EQ(dtype_size(DType::kFloat32), 4u);
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kInt64), 8u);
  EXPECT_EQ(dtype_size(DType::kInt32), 4u);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_STREQ(dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_STREQ(dtype_name(DType::kBool), "bool");
  EXPECT_EQ(dtype_size(static_cast<DType>(kDTypeCount)), 0u);
}

TEST(EngineFormat, RoundTripKeepsEveryField) {
  SEEDED_RNG(rng);
  EngineDesc d = make_engine(rng);
  ASSERT_TRUE(validate_engine(d).is_ok()) << validate_engine(d).message();
  std::vector<uint8_t> bytes = serialize_ok(d);
  auto parsed = parse_exact(bytes, bytes.size());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  expect_desc_eq(d, parsed.value());
  EXPECT_EQ(*parsed->find_metadata("target_sms"), "87,90");
}

TEST(EngineFormat, RoundTripKeepsDerivedWeightsAndPersistentSteps) {
  SEEDED_RNG(rng);
  EngineDesc d = make_engine(rng);
  add_derived_weight(d);
  // A second derived weight with many random copies, and a persistent step
  // whose grid[0] is larger than any GPU holds.
  DerivedWeight w;
  w.name = "fc.weight.columns";
  w.nbytes = 64 * 1024;
  std::uniform_int_distribution<uint32_t> rows(1, 32);
  for (uint32_t c = 0; c < 200; ++c) {
    const uint32_t r = rows(rng);
    w.copies.push_back(DerivedCopy{c % 2 == 0 ? 1u : 2u, 0, 16, c * 256ull, c % 2 == 0 ? r : 4, 16});
  }
  d.derived_weights.push_back(w);
  d.steps[1].kernel.grid[0] = 100000;
  d.steps[1].kernel.min_blocks = 132;
  ASSERT_TRUE(validate_engine(d).is_ok()) << validate_engine(d).message();
  std::vector<uint8_t> bytes = serialize_ok(d);
  auto parsed = parse_exact(bytes, bytes.size());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  expect_desc_eq(d, parsed.value());
  EXPECT_EQ(parsed->tensors.back().storage, StorageKind::kDerivedWeight);
  EXPECT_EQ(serialize_ok(parsed.value()), bytes);  // canonical
  // Every truncation of it fails cleanly.
  for (size_t len = 0; len < bytes.size(); len += 7) {
    auto r = parse_exact(bytes, len);
    ASSERT_FALSE(r.is_ok()) << "length " << len;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruptData) << "length " << len;
  }
}

TEST(EngineFormat, RoundTripEdgeCases) {
  EngineDesc empty;
  auto bytes = serialize_ok(empty);
  auto parsed = parse_exact(bytes, bytes.size());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  expect_desc_eq(empty, parsed.value());

  // c operand, relu epilogue, PTX-only module, scalar and zero-size tensors.
  SEEDED_RNG(rng);
  EngineDesc d = make_engine(rng);
  d.arena_bytes = 2048;
  TensorDesc c = d.tensors[3];
  c.name = "residual";
  c.offset = 1024;
  d.tensors.push_back(c);  // 5
  TensorDesc scalar;
  scalar.name = "scale";
  scalar.dtype = DType::kInt64;
  scalar.storage = StorageKind::kArena;
  scalar.offset = 1536;
  scalar.nbytes = 8;
  d.tensors.push_back(scalar);  // 6: rank 0
  TensorDesc none = scalar;
  none.name = "none";
  none.shape = {0, 5};
  none.nbytes = 0;
  none.offset = 2048;
  d.tensors.push_back(none);  // 7: empty, at the arena end
  d.steps[0].gemm.epilogue = GemmEpilogue::kRelu;
  d.steps[0].gemm.bias = kNoTensor;
  d.steps[0].gemm.c = 5;
  d.steps[0].gemm.beta = -0.0f;
  d.modules[0].cubins.clear();
  d.metadata.clear();
  bytes = serialize_ok(d);
  parsed = parse_exact(bytes, bytes.size());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  expect_desc_eq(d, parsed.value());
}

TEST(EngineFormat, SerializeIsDeterministicAndCanonical) {
  SEEDED_RNG(rng);
  EngineDesc d = make_engine(rng);
  std::vector<uint8_t> a = serialize_ok(d), b = serialize_ok(d);
  EXPECT_EQ(a, b);
  auto parsed = parse_exact(a, a.size());
  ASSERT_TRUE(parsed.is_ok());
  EXPECT_EQ(serialize_ok(parsed.value()), a);
}

TEST(EngineFormat, LayoutMatchesTheDocumentation) {
  SEEDED_RNG(rng);
  std::vector<uint8_t> b = serialize_ok(make_engine(rng));
  ASSERT_GE(b.size(), 256u);
  EXPECT_EQ(std::memcmp(b.data(), kEngineMagic, 8), 0);
  EXPECT_EQ(load_le32(&b[L::kVersionOffset]), kEngineFormatVersion);
  EXPECT_EQ(load_le32(&b[L::kSectionCountOffset]), 9u);
  EXPECT_EQ(load_le64(&b[L::kTotalSizeOffset]), b.size());
  for (uint32_t kind = 1; kind <= 9; ++kind) {
    SectionSpan s = find_section(b, static_cast<L::SectionKind>(kind));
    EXPECT_EQ(s.offset % 64, 0u) << L::section_name(kind);
    EXPECT_EQ(load_le32(&b[s.entry + L::kEntryCrcOffset]), crc32c(&b[s.offset], s.size));
  }
  SectionSpan w = find_section(b, L::SectionKind::kWeights);
  EXPECT_EQ(w.size, 4096u + 256u);
  SectionSpan named = find_section(b, L::SectionKind::kNamedWeights);
  EXPECT_EQ(named.offset, (w.offset + w.size + 63) / 64 * 64);
  EXPECT_EQ(named.size, 4u);  // no named weights: just the count
  SectionSpan states = find_section(b, L::SectionKind::kStates);
  EXPECT_EQ(states.offset, (named.offset + named.size + 63) / 64 * 64);
  EXPECT_EQ(states.size, 4u);  // no states: just the count
  SectionSpan derived = find_section(b, L::SectionKind::kDerivedWeights);
  EXPECT_EQ(derived.offset, (states.offset + states.size + 63) / 64 * 64);
  EXPECT_EQ(derived.size, 4u);  // no derived weights: just the count
  EXPECT_EQ(derived.offset + derived.size, b.size());
  EXPECT_STREQ(L::section_name(9), "derived_weights");
}

// Format v6: a derived weight's section is laid out as engine_writer.cpp says.
TEST(EngineFormat, DerivedWeightsSectionMatchesTheDocumentation) {
  SEEDED_RNG(rng);
  EngineDesc d = make_engine(rng);
  add_derived_weight(d);
  std::vector<uint8_t> b = serialize_ok(d);
  SectionSpan s = find_section(b, L::SectionKind::kDerivedWeights);
  // u32 n; {str name; u64 nbytes; u32 c; c x {u32 source; u64 offset, stride, dst; u32 rows, row_bytes}}
  const std::string name = "fc.weight.packed";
  ASSERT_EQ(s.size, 4 + 4 + name.size() + 8 + 4 + 3 * 36);
  size_t at = s.offset;
  EXPECT_EQ(load_le32(&b[at]), 1u);
  EXPECT_EQ(load_le32(&b[at + 4]), name.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(&b[at + 8]), name.size()), name);
  at += 8 + name.size();
  EXPECT_EQ(load_le64(&b[at]), 1024u);
  EXPECT_EQ(load_le32(&b[at + 8]), 3u);
  at += 12 + 36;  // copy 1
  EXPECT_EQ(load_le32(&b[at]), 1u);        // source
  EXPECT_EQ(load_le64(&b[at + 4]), 16u);   // offset
  EXPECT_EQ(load_le64(&b[at + 12]), 48u);  // stride
  EXPECT_EQ(load_le64(&b[at + 20]), 256u); // dst
  EXPECT_EQ(load_le32(&b[at + 28]), 8u);   // rows
  EXPECT_EQ(load_le32(&b[at + 32]), 16u);  // row_bytes
}

// ---- corruption ----------------------------------------------------------------

TEST(EngineFormat, EveryTruncationFails) {
  SEEDED_RNG(rng);
  std::vector<uint8_t> b = serialize_ok(make_engine(rng, 64));
  for (size_t len = 0; len < b.size(); ++len) {
    auto r = parse_exact(b, len);
    ASSERT_FALSE(r.is_ok()) << "length " << len;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruptData) << "length " << len;
    ASSERT_TRUE(contains(r.status().message(), "truncated"))
        << "length " << len << ": " << r.status().message();
  }
  auto whole = parse_exact(b, b.size());
  EXPECT_TRUE(whole.is_ok());
  auto longer = b;
  longer.push_back(0);
  auto r = parse_exact(longer, longer.size());
  ASSERT_FALSE(r.is_ok());
  EXPECT_MESSAGE_HAS(r.status(), "trailing");
}

// Flips bit (i % 8) of every `stride`-th byte; all must fail with a message.
void check_bit_flips(const std::vector<uint8_t>& b, size_t stride, bool all_bits) {
  for (size_t i = 0; i < b.size(); i += stride) {
    for (int bit = 0; bit < 8; ++bit) {
      if (!all_bits && bit != static_cast<int>(i % 8)) continue;
      std::vector<uint8_t> c = b;
      c[i] ^= static_cast<uint8_t>(1u << bit);
      auto r = parse_exact(c, c.size());
      ASSERT_FALSE(r.is_ok()) << "byte " << i << " bit " << bit;
      ASSERT_FALSE(r.status().message().empty()) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(EngineFormat, EveryBitFlipInASmallEngineFails) {
  SEEDED_RNG(rng);
  EngineDesc d = make_engine(rng, 16);
  // Shrink to n = 4 so the engine is ~1.5 KB and every bit can be tried.
  d.weights.resize(512);
  d.tensors[1].shape = {4, 64};  // fc.weight, 512 bytes at 0
  d.tensors[1].nbytes = 512;
  d.tensors[2].shape = {4};  // fc.bias aliases the weight start: legal
  d.tensors[2].nbytes = 8;
  d.tensors[2].offset = 0;
  for (int t : {3, 4}) {
    d.tensors[t].shape = {8, 4};
    d.tensors[t].nbytes = 64;
  }
  d.steps[0].gemm.n = 4;
  add_derived_weight(d);  // reads only fc.weight's first 512 bytes
  std::vector<uint8_t> b = serialize_ok(d);
  ASSERT_GT(b.size(), 1000u);
  ASSERT_LT(b.size(), 2400u);
  check_bit_flips(b, 1, true);
}

TEST(EngineFormat, StridedBitFlipsInARealisticEngineFail) {
  SEEDED_RNG(rng);
  std::vector<uint8_t> b = serialize_ok(make_engine(rng, 4096));
  ASSERT_GT(b.size(), 12000u);
  check_bit_flips(b, 3, false);
}

TEST(EngineFormat, SpecificCorruptionMessages) {
  SEEDED_RNG(rng);
  std::vector<uint8_t> b = serialize_ok(make_engine(rng));

  auto bad_magic = b;
  bad_magic[3] = 'X';
  auto r = parse_exact(bad_magic, bad_magic.size());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruptData);
  EXPECT_MESSAGE_HAS(r.status(), "not a Kiln engine (bad magic)");

  auto newer = b;
  put32(newer, L::kVersionOffset, kEngineFormatVersion + 1);
  r = parse_exact(newer, newer.size());
  EXPECT_EQ(r.status().code(), StatusCode::kIncompatible);
  EXPECT_MESSAGE_HAS(r.status(), "engine format version " + std::to_string(kEngineFormatVersion + 1) +
                                     ", this runtime reads version " +
                                     std::to_string(kEngineFormatVersion));
  EXPECT_MESSAGE_HAS(r.status(), "update the Kiln runtime");

  auto weights = b;
  SectionSpan w = find_section(b, L::SectionKind::kWeights);
  weights[w.offset + rng() % w.size] ^= 0x10;
  r = parse_exact(weights, weights.size());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruptData);
  EXPECT_MESSAGE_HAS(r.status(), "weights");
  EXPECT_MESSAGE_HAS(r.status(), "checksum");

  auto header = b;
  header[L::kTotalSizeOffset + 1] ^= 1;
  r = parse_exact(header, header.size());
  EXPECT_MESSAGE_HAS(r.status(), "header checksum");

  // The gap before the first section that does not follow its predecessor
  // directly (sections are 64-byte aligned).
  auto padding = b;
  size_t gap_end = 0;
  for (uint32_t kind = 2; kind <= L::kSectionCount && gap_end == 0; ++kind) {
    SectionSpan prev = find_section(b, static_cast<L::SectionKind>(kind - 1));
    SectionSpan s = find_section(b, static_cast<L::SectionKind>(kind));
    if (s.offset > prev.offset + prev.size) gap_end = s.offset;
  }
  ASSERT_GT(gap_end, 0u);  // there is a gap
  padding[gap_end - 1] = 1;
  r = parse_exact(padding, padding.size());
  EXPECT_MESSAGE_HAS(r.status(), "padding");

  EXPECT_FALSE(parse_engine(nullptr, 10).is_ok());
}

// Behind valid checksums: hostile section contents must still be rejected.
TEST(EngineFormat, ResealedGarbageIsRejectedWithoutCrashing) {
  SEEDED_RNG(rng);
  std::vector<uint8_t> b = serialize_ok(make_engine(rng, 64));
  auto sealed = b;
  reseal(sealed);
  ASSERT_EQ(sealed, b);

  auto expect_rejected = [&](const std::vector<uint8_t>& c, const char* sub) {
    auto r = parse_exact(c, c.size());
    ASSERT_FALSE(r.is_ok()) << sub;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruptData);
    EXPECT_MESSAGE_HAS(r.status(), sub);
  };
  SectionSpan tensors = find_section(b, L::SectionKind::kTensors);
  SectionSpan steps = find_section(b, L::SectionKind::kSteps);
  SectionSpan meta = find_section(b, L::SectionKind::kMeta);

  auto c = b;
  put32(c, tensors.offset, 0xfffffff0u);  // tensor count
  reseal(c);
  expect_rejected(c, "tensor count");

  c = b;
  put32(c, tensors.offset + 4, 0x7fffffffu);  // tensor 0 name length
  reseal(c);
  expect_rejected(c, "tensor 0 name");

  c = b;
  c[tensors.offset + 4 + 4 + 1 + 2] = 200;  // tensor 0 ("x") rank
  reseal(c);
  expect_rejected(c, "rank 200");

  c = b;
  c[steps.offset + 4] = 9;  // step 0 kind
  reseal(c);
  expect_rejected(c, "step 0: unknown kind 9");

  c = b;
  put64(c, meta.offset, 0);  // arena_bytes
  reseal(c);
  expect_rejected(c, "arena");

  c = b;  // two entries claiming the same section
  put32(c, L::kHeaderSize + L::kEntrySize, 1);
  reseal(c);
  expect_rejected(c, "more than once");

  c = b;  // a misaligned section
  put64(c, tensors.entry + L::kEntryOffsetOffset, tensors.offset + 8);
  reseal(c);
  expect_rejected(c, "misaligned");

  // Random damage inside sections, resealed: any outcome but a crash.
  size_t table_end = L::kHeaderSize + L::kSectionCount * L::kEntrySize;
  for (int iter = 0; iter < 3000; ++iter) {
    c = b;
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      size_t at = table_end + rng() % (c.size() - table_end);
      c[at] = (rng() % 3 == 0) ? 0xff : static_cast<uint8_t>(rng());
    }
    reseal(c);
    auto r = parse_exact(c, c.size());
    if (!r.is_ok()) {
      ASSERT_FALSE(r.status().message().empty());
    }
  }
}

// Meaning checks behind valid checksums: a crafted engine whose numbers no
// longer fit its tensors is refused naming the step and the field, even with
// every CRC recomputed.
TEST(EngineFormat, ResealedTamperedStepsAreRefusedNamingStepAndField) {
  SEEDED_RNG(rng);
  const std::vector<uint8_t> b = serialize_ok(make_engine(rng, 64));
  const SectionSpan steps = find_section(b, L::SectionKind::kSteps);
  // Steps section (format v3): u32 count; per step u8 kind, str label,
  // u32 payload size, payload (steps/<kind>_step_format.cpp).
  const size_t step0 = steps.offset + 4;
  const size_t gemm = step0 + 1 + 4 + 5 + 4;  // label "addmm"
  ASSERT_EQ(load_le32(&b[step0 + 1 + 4 + 5]), 94u) << "gemm payload size";
  const size_t gemm_m = gemm + 5 * 4;
  const size_t step1 = gemm + 94;
  const size_t kernel = step1 + 1 + 4 + 4 + 4;  // label "gelu"
  // module, "gelu_kernel", grid, block, shared_bytes, arg count, 2 tensor args, kind byte
  const size_t grid = kernel + 4 + 4 + 11;
  // grid, block, shared_bytes, min_blocks (v6), arg count, 2 tensor args, kind byte
  const size_t min_blocks = grid + 12 + 12 + 4;
  const size_t count_arg = min_blocks + 4 + 4 + 2 * (1 + 4) + 1;
  ASSERT_EQ(load_le32(&b[min_blocks]), 0u);
  ASSERT_EQ(load_le64(&b[gemm_m]), 8u);
  ASSERT_EQ(static_cast<int64_t>(load_le64(&b[count_arg])), -(int64_t{1} << 40) + 256);

  auto expect_refused = [&](std::vector<uint8_t> c, std::initializer_list<const char*> subs) {
    reseal(c);
    auto r = parse_exact(c, c.size());
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorruptData);
    for (const char* sub : subs) EXPECT_MESSAGE_HAS(r.status(), sub);
  };
  auto c = b;
  put64(c, gemm_m, 16);  // m doubled: a [8, 64] no longer holds [m, k]
  expect_refused(c, {"step 0 (gemm 'addmm')", "gemm a tensor 0 'x'", "expected [16, 64]"});

  c = b;
  put64(c, count_arg, 257);  // one past the 256 elements of its output
  expect_refused(c, {"step 1 (kernel 'gelu')", "arg 2 count 257",
                     "256 elements of its output (arg 0, tensor 3 'fc_out')"});

  c = b;
  put32(c, grid + 4, 65536);  // grid.y above CUDA's limit
  expect_refused(c, {"step 1 (kernel 'gelu')", "grid dim 1 is 65536"});

  c = b;
  put32(c, min_blocks, 3);  // a persistent kernel may not need more blocks than grid[0] (2)
  expect_refused(c, {"step 1 (kernel 'gelu')", "min_blocks 3 exceeds grid[0] 2"});

  c = b;
  put32(c, step0 + 1 + 4 + 5, 95);  // payload size no longer matches the gemm fields
  expect_refused(c, {"step 0"});

  // An engine of the previous format version is refused with a rebuild hint.
  c = b;
  put32(c, L::kVersionOffset, kEngineFormatVersion - 1);
  auto r = parse_exact(c, c.size());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIncompatible);
  EXPECT_MESSAGE_HAS(r.status(), "engine format version " +
                                     std::to_string(kEngineFormatVersion - 1));
  EXPECT_MESSAGE_HAS(r.status(), "rebuild the .pte");
  EXPECT_MESSAGE_HAS(r.status(), "re-exporting the model");
  EXPECT_MESSAGE_HAS(r.status(), "with this Kiln");
  EXPECT_EQ(kEngineFormatVersion, 6u);  // so the previous version above is 5
}

}  // namespace
}  // namespace kiln::engine
