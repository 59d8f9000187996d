#include "engine_format_test_util.h"

#include <cstdlib>
#include <cstring>
#include <memory>

#include "engine_format/byte_io.h"

namespace kiln::engine::format_test {

namespace L = layout;

uint32_t test_seed() {
  if (const char* env = std::getenv("KILN_TEST_SEED"))
    return static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  return std::random_device{}();
}

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

EngineDesc make_engine(std::mt19937& rng, size_t cubin_bytes) {
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

void add_derived_weight(EngineDesc& d) {
  DerivedWeight w;
  w.name = "fc.weight.packed";
  w.nbytes = 1024;
  // Rows of fc.weight, 128-byte rows read 64 bytes at a time, then a 16-byte
  // column 48 bytes apart, then one 32-byte row (its stride unused).
  w.copies.push_back(DerivedCopy{1, 0, 128, 0, 4, 64});
  w.copies.push_back(DerivedCopy{1, 16, 48, 256, 8, 16});
  w.copies.push_back(DerivedCopy{1, 480, 0, 512, 1, 32});
  d.derived_weights.push_back(w);
  TensorDesc t;
  t.name = "fc.weight.packed";
  t.dtype = DType::kFloat16;
  t.shape = {2, 256};
  t.storage = StorageKind::kDerivedWeight;
  t.io_index = static_cast<uint32_t>(d.derived_weights.size() - 1);
  t.offset = 0;
  t.nbytes = 1024;
  d.tensors.push_back(t);
  d.steps[1].kernel.min_blocks = 1;  // gelu, grid[0] = 2: persistent, 1 or 2 blocks
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
    EXPECT_EQ(k.min_blocks, l.min_blocks);
    ASSERT_EQ(k.args.size(), l.args.size());
    for (size_t j = 0; j < k.args.size(); ++j) {
      EXPECT_EQ(k.args[j].kind, l.args[j].kind);
      EXPECT_EQ(k.args[j].tensor, l.args[j].tensor);
      EXPECT_EQ(k.args[j].i64, l.args[j].i64);
      EXPECT_EQ(k.args[j].f32, l.args[j].f32);
    }
  }
  ASSERT_EQ(a.derived_weights.size(), b.derived_weights.size());
  for (size_t i = 0; i < a.derived_weights.size(); ++i) {
    SCOPED_TRACE("derived weight " + std::to_string(i));
    const DerivedWeight &x = a.derived_weights[i], &y = b.derived_weights[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.nbytes, y.nbytes);
    ASSERT_EQ(x.copies.size(), y.copies.size());
    for (size_t c = 0; c < x.copies.size(); ++c) {
      SCOPED_TRACE("copy " + std::to_string(c));
      EXPECT_EQ(x.copies[c].source, y.copies[c].source);
      EXPECT_EQ(x.copies[c].offset, y.copies[c].offset);
      EXPECT_EQ(x.copies[c].stride, y.copies[c].stride);
      EXPECT_EQ(x.copies[c].dst, y.copies[c].dst);
      EXPECT_EQ(x.copies[c].rows, y.copies[c].rows);
      EXPECT_EQ(x.copies[c].row_bytes, y.copies[c].row_bytes);
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

}  // namespace kiln::engine::format_test
