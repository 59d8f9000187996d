// Engine format tests: round trip, determinism, CRC-32C, corruption handling
// (truncation, bit flips, re-checksummed garbage) and validate_engine.
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

namespace kiln::engine {
namespace {

namespace L = layout;

uint32_t test_seed() {
  if (const char* env = std::getenv("KILN_TEST_SEED"))
    return static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  return std::random_device{}();
}

// Declares `rng`, seeded, with the seed in every failure message of the test.
#define SEEDED_RNG(rng)                                                        \
  const uint32_t rng##_seed = test_seed();                                     \
  SCOPED_TRACE(::testing::Message() << "KILN_TEST_SEED=" << rng##_seed);       \
  std::mt19937 rng(rng##_seed)

bool contains(const std::string& s, const std::string& sub) {
  return s.find(sub) != std::string::npos;
}

#define EXPECT_MESSAGE_HAS(status, sub) \
  EXPECT_TRUE(contains((status).message(), sub)) << "message: " << (status).message()

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A small MLP block: y = gelu(x @ W^T + b), fp16, with real-looking parts.
// `cubin_bytes` scales the module images (small engines keep the exhaustive
// bit-flip test fast).
EngineDesc make_engine(std::mt19937& rng, size_t cubin_bytes = 1024) {
  EngineDesc d;
  auto tensor = [&](const char* name, std::vector<int64_t> shape, StorageKind storage,
                    uint32_t io_index, uint64_t offset) {
    TensorDesc t;
    t.name = name;
    t.dtype = DType::kFloat16;
    t.shape = std::move(shape);
    t.storage = storage;
    t.io_index = io_index;
    t.offset = offset;
    t.nbytes = 2;
    for (int64_t s : t.shape) t.nbytes *= static_cast<uint64_t>(s);
    d.tensors.push_back(t);
  };
  tensor("x", {8, 64}, StorageKind::kInput, 0, 0);              // 0
  tensor("fc.weight", {32, 64}, StorageKind::kWeight, 0, 0);    // 1: 4096 bytes
  tensor("fc.bias", {32}, StorageKind::kWeight, 0, 4096);       // 2: 64 bytes
  tensor("fc_out", {8, 32}, StorageKind::kArena, 0, 256);       // 3: 512 bytes
  tensor("y", {8, 32}, StorageKind::kOutput, 0, 0);             // 4
  d.inputs = {0};
  d.outputs = {4};
  d.arena_bytes = 1024;
  d.weights = random_bytes(rng, 4096 + 256);

  KernelModule m;
  m.name = "fused_gelu";
  m.cubins.push_back({87, random_bytes(rng, cubin_bytes)});
  m.cubins.push_back({90, random_bytes(rng, cubin_bytes + 100)});
  m.ptx = ".version 8.5\n.target sm_90\n.address_size 64\n.visible .entry gelu_kernel()\n{ ret; }\n";
  m.ptx_sm = 90;
  m.source = "extern \"C\" __global__ void gelu_kernel(const __half* x, __half* y, long n, float s) {}\n";
  d.modules.push_back(m);

  Step gemm;
  gemm.kind = StepKind::kGemm;
  gemm.label = "addmm";
  gemm.gemm.a = 0;
  gemm.gemm.b = 1;
  gemm.gemm.bias = 2;
  gemm.gemm.out = 3;
  gemm.gemm.m = 8;
  gemm.gemm.n = 32;
  gemm.gemm.k = 64;
  gemm.gemm.b_transposed = true;
  gemm.gemm.epilogue = GemmEpilogue::kBias;
  gemm.gemm.alpha = 0.75f;
  d.steps.push_back(gemm);

  Step kernel;
  kernel.kind = StepKind::kKernel;
  kernel.label = "gelu";
  kernel.kernel.module = 0;
  kernel.kernel.function = "gelu_kernel";
  kernel.kernel.grid[0] = 2;
  kernel.kernel.block[0] = 128;
  kernel.kernel.shared_bytes = 512;
  KernelArg a;
  a.kind = KernelArgKind::kTensor;
  a.tensor = 3;
  kernel.kernel.args.push_back(a);
  a.tensor = 4;
  kernel.kernel.args.push_back(a);
  a = KernelArg();
  a.kind = KernelArgKind::kInt64;
  a.i64 = -(int64_t{1} << 40) + 256;
  kernel.kernel.args.push_back(a);
  a = KernelArg();
  a.kind = KernelArgKind::kFloat32;
  a.f32 = 0.7978845608f;
  kernel.kernel.args.push_back(a);
  d.steps.push_back(kernel);

  d.metadata = {{"precision", "float16"}, {"target_sms", "87,90"}, {"use_cuda_graphs", "true"}};
  return d;
}

void expect_desc_eq(const EngineDesc& a, const EngineDesc& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    const TensorDesc &x = a.tensors[i], &y = b.tensors[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.shape, y.shape);
    EXPECT_EQ(x.storage, y.storage);
    EXPECT_EQ(x.io_index, y.io_index);
    EXPECT_EQ(x.offset, y.offset);
    EXPECT_EQ(x.nbytes, y.nbytes);
  }
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.outputs, b.outputs);
  ASSERT_EQ(a.modules.size(), b.modules.size());
  for (size_t i = 0; i < a.modules.size(); ++i) {
    const KernelModule &x = a.modules[i], &y = b.modules[i];
    EXPECT_EQ(x.name, y.name);
    ASSERT_EQ(x.cubins.size(), y.cubins.size());
    for (size_t c = 0; c < x.cubins.size(); ++c) {
      EXPECT_EQ(x.cubins[c].sm, y.cubins[c].sm);
      EXPECT_EQ(x.cubins[c].image, y.cubins[c].image);
    }
    EXPECT_EQ(x.ptx, y.ptx);
    EXPECT_EQ(x.ptx_sm, y.ptx_sm);
    EXPECT_EQ(x.source, y.source);
  }
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    const Step &x = a.steps[i], &y = b.steps[i];
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.label, y.label);
    const GemmStep &g = x.gemm, &h = y.gemm;
    EXPECT_EQ(g.a, h.a);
    EXPECT_EQ(g.b, h.b);
    EXPECT_EQ(g.bias, h.bias);
    EXPECT_EQ(g.c, h.c);
    EXPECT_EQ(g.out, h.out);
    EXPECT_EQ(g.m, h.m);
    EXPECT_EQ(g.n, h.n);
    EXPECT_EQ(g.k, h.k);
    EXPECT_EQ(g.b_transposed, h.b_transposed);
    EXPECT_EQ(g.epilogue, h.epilogue);
    EXPECT_EQ(g.alpha, h.alpha);
    EXPECT_EQ(g.beta, h.beta);
    const KernelStep &k = x.kernel, &l = y.kernel;
    EXPECT_EQ(k.module, l.module);
    EXPECT_EQ(k.function, l.function);
    for (int dim = 0; dim < 3; ++dim) {
      EXPECT_EQ(k.grid[dim], l.grid[dim]);
      EXPECT_EQ(k.block[dim], l.block[dim]);
    }
    EXPECT_EQ(k.shared_bytes, l.shared_bytes);
    ASSERT_EQ(k.args.size(), l.args.size());
    for (size_t j = 0; j < k.args.size(); ++j) {
      EXPECT_EQ(k.args[j].kind, l.args[j].kind);
      EXPECT_EQ(k.args[j].tensor, l.args[j].tensor);
      EXPECT_EQ(k.args[j].i64, l.args[j].i64);
      EXPECT_EQ(k.args[j].f32, l.args[j].f32);
    }
  }
  EXPECT_EQ(a.arena_bytes, b.arena_bytes);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_EQ(a.metadata, b.metadata);
}

std::vector<uint8_t> serialize_ok(const EngineDesc& d) {
  auto r = serialize_engine(d);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? r.value() : std::vector<uint8_t>();
}

// Parses the first `len` bytes from a heap block of exactly that size, so
// ASan flags any read past the end.
Result<EngineDesc> parse_exact(const std::vector<uint8_t>& bytes, size_t len) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[len]);
  if (len > 0) std::memcpy(copy.get(), bytes.data(), len);
  return parse_engine(copy.get(), len);
}

void put32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
void put64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

struct SectionSpan {
  size_t entry = 0, offset = 0, size = 0;
};

SectionSpan find_section(const std::vector<uint8_t>& b, L::SectionKind kind) {
  for (size_t i = 0; i < L::kSectionCount; ++i) {
    size_t e = L::kHeaderSize + i * L::kEntrySize;
    if (load_le32(&b[e]) == static_cast<uint32_t>(kind))
      return {e, static_cast<size_t>(load_le64(&b[e + L::kEntryOffsetOffset])),
              static_cast<size_t>(load_le64(&b[e + L::kEntrySizeOffset]))};
  }
  ADD_FAILURE() << "section not found";
  return {};
}

// Recomputes every checksum, so a test can reach the parser behind them.
void reseal(std::vector<uint8_t>& b) {
  size_t table_end = L::kHeaderSize + L::kSectionCount * L::kEntrySize;
  for (size_t i = 0; i < L::kSectionCount; ++i) {
    size_t e = L::kHeaderSize + i * L::kEntrySize;
    uint64_t off = load_le64(&b[e + L::kEntryOffsetOffset]);
    uint64_t size = load_le64(&b[e + L::kEntrySizeOffset]);
    if (off <= b.size() && size <= b.size() - off)
      put32(b, e + L::kEntryCrcOffset, crc32c(b.data() + off, size));
  }
  uint32_t crc = crc32c(b.data(), L::kHeaderCrcOffset);
  put32(b, L::kHeaderCrcOffset, crc32c(b.data() + L::kHeaderSize, table_end - L::kHeaderSize, crc));
}

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
  EXPECT_EQ(load_le32(&b[L::kSectionCountOffset]), 8u);
  EXPECT_EQ(load_le64(&b[L::kTotalSizeOffset]), b.size());
  for (uint32_t kind = 1; kind <= 8; ++kind) {
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
  EXPECT_EQ(states.offset + states.size, b.size());
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
  std::vector<uint8_t> b = serialize_ok(d);
  ASSERT_GT(b.size(), 1000u);
  ASSERT_LT(b.size(), 2000u);
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
  const size_t count_arg = grid + 12 + 12 + 4 + 4 + 2 * (1 + 4) + 1;
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
  EXPECT_MESSAGE_HAS(r.status(), "with this Kiln");
}

// ---- validate_engine -------------------------------------------------------------

void expect_invalid(const EngineDesc& d, std::initializer_list<const char*> subs) {
  Status st = validate_engine(d);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  for (const char* sub : subs) EXPECT_MESSAGE_HAS(st, sub);
}

TEST(ValidateEngine, RejectsInconsistentEngines) {
  SEEDED_RNG(rng);
  const EngineDesc base = make_engine(rng);
  auto with = [&](const std::function<void(EngineDesc&)>& edit) {
    EngineDesc d = base;
    edit(d);
    return d;
  };
  expect_invalid(with([](EngineDesc& d) { d.steps[0].gemm.a = 17; }),
                 {"step 0 (gemm 'addmm')", "tensor 17 out of range"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].kernel.args[1].tensor = 5; }),
                 {"step 1 (kernel 'gelu')", "arg 1 tensor 5"});
  expect_invalid(with([](EngineDesc& d) { d.tensors[3].offset = 768; }),
                 {"tensor 3 'fc_out'", "arena"});
  expect_invalid(with([](EngineDesc& d) { d.tensors[3].offset = ~uint64_t{0} - 8; }),
                 {"tensor 3 'fc_out'", "arena"});
  expect_invalid(with([](EngineDesc& d) { d.tensors[1].offset = 512; }),
                 {"tensor 1 'fc.weight'", "weights"});
  expect_invalid(with([](EngineDesc& d) { d.tensors[2].offset = 4100; }),
                 {"tensor 2 'fc.bias'", "aligned"});
  expect_invalid(with([](EngineDesc& d) { d.tensors[0].nbytes += 2; }),
                 {"tensor 0 'x'", "nbytes"});
  expect_invalid(with([](EngineDesc& d) { d.tensors[0].shape[0] = -8; }),
                 {"tensor 0 'x'", "negative"});
  expect_invalid(with([](EngineDesc& d) {
                   d.tensors[3].shape = {int64_t{1} << 40, int64_t{1} << 40};
                 }),
                 {"tensor 3 'fc_out'", "overflow"});
  expect_invalid(with([](EngineDesc& d) { d.tensors[3].shape.assign(9, 1); }),
                 {"tensor 3 'fc_out'", "rank 9"});
  expect_invalid(with([](EngineDesc& d) { d.tensors[3].dtype = static_cast<DType>(17); }),
                 {"tensor 3 'fc_out'", "dtype 17"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].gemm.k = 32; }),
                 {"step 0 (gemm 'addmm')", "gemm a tensor 0 'x'"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].gemm.b_transposed = false; }),
                 {"step 0 (gemm 'addmm')", "gemm b tensor 1 'fc.weight'"});
  expect_invalid(with([](EngineDesc& d) {
                   d.tensors[2].dtype = DType::kFloat32;
                   d.tensors[2].nbytes = 128;
                 }),
                 {"step 0 (gemm 'addmm')", "bias tensor 2 'fc.bias' is float32"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].gemm.epilogue = GemmEpilogue::kNone; }),
                 {"step 0", "bias"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].gemm.out = 1; }), {"step 0", "weight"});
  expect_invalid(with([](EngineDesc& d) { d.tensors[0].io_index = 1; }),
                 {"tensor 0 'x'", "input index 1 out of range"});
  expect_invalid(with([](EngineDesc& d) { d.outputs = {3}; }),
                 {"tensor 4 'y'", "output 0 is tensor 3"});
  expect_invalid(with([](EngineDesc& d) { d.inputs.push_back(0); }), {"input 1", "tensor 0 'x'"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].kernel.module = 1; }),
                 {"step 1 (kernel 'gelu')", "module 1 out of range"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].kernel.function.clear(); }),
                 {"step 1", "function"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].kernel.grid[1] = 0; }), {"step 1", "grid"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].kernel.block[1] = 16; }),
                 {"step 1", "2048 threads"});
  expect_invalid(with([](EngineDesc& d) {
                   d.modules[0].cubins.clear();
                   d.modules[0].ptx.clear();
                 }),
                 {"module 0 'fused_gelu'", "neither"});
  expect_invalid(with([](EngineDesc& d) { d.modules[0].cubins[1].sm = 87; }),
                 {"module 0", "sm_87"});
  expect_invalid(with([](EngineDesc& d) { d.metadata.push_back({"precision", "float32"}); }),
                 {"metadata key 'precision'"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].kind = static_cast<StepKind>(4); }),
                 {"step 1 'gelu'", "kind 4"});
  // Meaning checks: counts and extents must fit the tensors they touch.
  expect_invalid(with([](EngineDesc& d) { d.steps[0].gemm.m = 16; }),
                 {"step 0 (gemm 'addmm')", "gemm a tensor 0 'x'", "expected [16, 64]"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].kernel.args[2].i64 = 257; }),
                 {"step 1 (kernel 'gelu')", "arg 2 count 257 exceeds the 256 elements"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].kernel.args[0].tensor = 1; }),
                 {"step 1 (kernel 'gelu')", "arg 0 (the output) tensor 1 'fc.weight' is a weight"});
  expect_invalid(with([](EngineDesc& d) {
                   d.steps[1].kernel.args[0].kind = KernelArgKind::kFloat32;
                 }),
                 {"step 1 (kernel 'gelu')", "arg 0 must be the output tensor"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].kernel.grid[2] = 65536; }),
                 {"step 1", "grid dim 2 is 65536"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].kernel.grid[0] = 0x80000000u; }),
                 {"step 1", "grid dim 0 is 2147483648"});
  expect_invalid(with([](EngineDesc& d) {
                   d.steps[0].gemm.bias = 4;
                 }),
                 {"step 0 (gemm 'addmm')", "gemm bias tensor 4 'y'"});
}

TEST(ValidateEngine, SerializeRefusesAnInvalidEngine) {
  SEEDED_RNG(rng);
  EngineDesc d = make_engine(rng);
  d.steps[0].gemm.out = 99;
  auto r = serialize_engine(d);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_MESSAGE_HAS(r.status(), "step 0");
}

// ---- named weights (format version 4) -------------------------------------------

TEST(EngineFormatNamedWeights, ExternalizeMovesEveryWeightAndRoundTrips) {
  SEEDED_RNG(rng);
  EngineDesc d = make_engine(rng);
  const std::vector<uint8_t> blob = d.weights;
  auto split = externalize_weights(&d, "kiln/model-a/");
  ASSERT_TRUE(split.is_ok()) << split.status().message();
  EXPECT_TRUE(d.weights.empty());
  ASSERT_EQ(d.named_weights.size(), 2u);
  ASSERT_EQ(split.value().size(), 2u);
  // Tensor 1 (fc.weight, 4096 bytes at 0) and 2 (fc.bias, 64 bytes at 4096).
  for (uint32_t t : {1u, 2u}) {
    const TensorDesc& td = d.tensors[t];
    EXPECT_EQ(td.storage, StorageKind::kNamedWeight);
    EXPECT_EQ(td.offset, 0u);
    const NamedWeight& n = d.named_weights[td.io_index];
    const std::vector<uint8_t>& bytes = split.value()[td.io_index];
    const uint64_t at = t == 1 ? 0 : 4096;
    EXPECT_EQ(bytes, std::vector<uint8_t>(blob.begin() + at, blob.begin() + at + td.nbytes));
    EXPECT_EQ(n.nbytes, td.nbytes);
    EXPECT_EQ(n.hash, hash_bytes(bytes.data(), bytes.size()));
    EXPECT_EQ(n.key.rfind("kiln/model-a/", 0), 0u) << n.key;
    EXPECT_NE(n.key.find("-" + std::to_string(td.nbytes)), std::string::npos) << n.key;
  }
  std::vector<uint8_t> bytes = serialize_ok(d);
  auto parsed = parse_exact(bytes, bytes.size());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
  ASSERT_EQ(parsed.value().named_weights.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(parsed.value().named_weights[i].key, d.named_weights[i].key);
    EXPECT_EQ(parsed.value().named_weights[i].nbytes, d.named_weights[i].nbytes);
    EXPECT_EQ(parsed.value().named_weights[i].hash, d.named_weights[i].hash);
  }
  EXPECT_EQ(serialize_ok(parsed.value()), bytes);
  // The engine no longer carries the weight bytes.
  EXPECT_LT(bytes.size(), serialize_ok(make_engine(rng)).size() - 4096);
}

TEST(EngineFormatNamedWeights, SameContentOneKeyOtherModelOtherKey) {
  SEEDED_RNG(rng);
  EngineDesc d = make_engine(rng);
  TensorDesc copy = d.tensors[2];  // fc.bias again, same bytes
  copy.name = "fc.bias_again";
  d.tensors.push_back(copy);
  EngineDesc other = d;
  auto a = externalize_weights(&d, "kiln/model-a/");
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  EXPECT_EQ(d.named_weights.size(), 2u);  // the two bias tensors share one
  EXPECT_EQ(d.tensors[2].io_index, d.tensors.back().io_index);
  auto b = externalize_weights(&other, "kiln/model-b/");
  ASSERT_TRUE(b.is_ok());
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NE(d.named_weights[i].key, other.named_weights[i].key);  // model ids differ
    EXPECT_EQ(d.named_weights[i].hash, other.named_weights[i].hash);
  }
  EngineDesc empty_prefix = make_engine(rng);
  EXPECT_FALSE(externalize_weights(&empty_prefix, "").is_ok());
}

TEST(EngineFormatNamedWeights, ValidationNamesEachProblem) {
  SEEDED_RNG(rng);
  EngineDesc base = make_engine(rng);
  ASSERT_TRUE(externalize_weights(&base, "kiln/m/").is_ok());
  ASSERT_TRUE(validate_engine(base).is_ok());
  auto expect_invalid = [](const EngineDesc& d, const char* what) {
    Status s = validate_engine(d);
    EXPECT_FALSE(s.is_ok()) << what;
    EXPECT_MESSAGE_HAS(s, what);
  };
  EngineDesc d = base;
  d.tensors[1].io_index = 7;
  expect_invalid(d, "named weight 7 out of range");
  d = base;
  d.tensors[1].offset = 256;  // 256 + 4096 > 4096
  expect_invalid(d, "lies outside the 4096-byte named weight");
  d = base;
  d.named_weights[1].key = d.named_weights[0].key;
  expect_invalid(d, "appears more than once");
  d = base;
  d.named_weights[0].key = "";
  expect_invalid(d, "key length 0");
  d = base;
  d.named_weights[0].key = "kiln/m/a b";
  expect_invalid(d, "not printable ASCII");
  d = base;
  d.named_weights[0].nbytes = 0;
  expect_invalid(d, "0 bytes");
  d = base;
  d.steps[0].gemm.out = 1;  // a step may not write a weight
  EXPECT_FALSE(validate_engine(d).is_ok());
}

// ---- states (mutable buffers, format version 5) ----------------------------------

// The engine with a 2 KiB state read by the kernel step's first argument.
EngineDesc engine_with_state(std::mt19937& rng, std::vector<uint8_t> init) {
  EngineDesc d = make_engine(rng);
  d.states.push_back(StateDesc{"kiln/m/state/k_cache", 2048, std::move(init)});
  TensorDesc t;
  t.name = "k_cache";
  t.dtype = DType::kFloat16;
  t.shape = {4, 256};
  t.storage = StorageKind::kState;
  t.io_index = 0;
  t.offset = 0;
  t.nbytes = 2048;
  d.tensors.push_back(t);
  return d;
}

TEST(EngineFormatStates, RoundTripWithAndWithoutInitialValue) {
  SEEDED_RNG(rng);
  for (bool zeros : {true, false}) {
    EngineDesc d = engine_with_state(rng, zeros ? std::vector<uint8_t>{} : random_bytes(rng, 2048));
    std::vector<uint8_t> b = serialize_ok(d);
    auto parsed = parse_engine(b.data(), b.size());
    ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
    ASSERT_EQ(parsed.value().states.size(), 1u);
    EXPECT_EQ(parsed.value().states[0].key, "kiln/m/state/k_cache");
    EXPECT_EQ(parsed.value().states[0].nbytes, 2048u);
    EXPECT_EQ(parsed.value().states[0].init, d.states[0].init);
    EXPECT_EQ(parsed.value().tensors.back().storage, StorageKind::kState);
  }
}

TEST(EngineFormatStates, ValidationNamesEachProblem) {
  SEEDED_RNG(rng);
  const EngineDesc base = engine_with_state(rng, {});
  ASSERT_TRUE(validate_engine(base).is_ok());
  auto expect_invalid = [](const EngineDesc& d, const char* what) {
    Status s = validate_engine(d);
    EXPECT_FALSE(s.is_ok()) << what;
    EXPECT_MESSAGE_HAS(s, what);
  };
  EngineDesc d = base;
  d.tensors.back().io_index = 3;
  expect_invalid(d, "state 3 out of range");
  d = base;
  d.tensors.back().offset = 2;
  expect_invalid(d, "lies outside the 2048-byte state");
  d = base;
  d.states[0].init.assign(100, 1);
  expect_invalid(d, "initial value of 100 bytes");
  d = base;
  d.states.push_back(d.states[0]);
  expect_invalid(d, "appears more than once");
  d = base;
  d.states[0].nbytes = 0;
  d.tensors.back().nbytes = 0;
  expect_invalid(d, "0 bytes");
}

}  // namespace
}  // namespace kiln::engine
