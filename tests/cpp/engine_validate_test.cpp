// validate_engine's refusals, named weights (format version 4), states
// (mutable buffers, format version 5), derived weights and persistent kernel
// steps (format version 6): what the engine format accepts beyond its bytes
// being intact (engine_format_test.cpp).
//
// Random data comes from a seed printed with every failure; set KILN_TEST_SEED
// to replay one.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine_format/engine_format.h"
#include "engine_format_test_util.h"

namespace kiln::engine {
namespace {

using namespace format_test;  // NOLINT: the shared test helpers

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

// ---- derived weights and persistent kernel steps (format version 6) --------------

// One case per rule: each edit of the valid engine is refused with a message
// naming the derived weight (index and name), the copy, and expected vs got.
TEST(EngineFormatDerivedWeights, ValidationNamesEachProblem) {
  SEEDED_RNG(rng);
  EngineDesc base = make_engine(rng);
  add_derived_weight(base);
  ASSERT_TRUE(validate_engine(base).is_ok()) << validate_engine(base).message();
  const uint32_t packed = static_cast<uint32_t>(base.tensors.size() - 1);
  auto with = [&](const std::function<void(EngineDesc&)>& edit) {
    EngineDesc d = base;
    edit(d);
    return d;
  };
  auto copy1 = [](EngineDesc& d) -> DerivedCopy& { return d.derived_weights[0].copies[1]; };
  const char* w0 = "derived weight 0 'fc.weight.packed'";
  const char* c1 = "derived weight 0 'fc.weight.packed' copy 1";

  // The tensor that views it.
  expect_invalid(with([&](EngineDesc& d) { d.tensors[packed].io_index = 3; }),
                 {"tensor 5 'fc.weight.packed'", "derived weight 3 out of range (engine has 1)"});
  expect_invalid(with([&](EngineDesc& d) { d.tensors[packed].offset = 16; }),
                 {"tensor 5 'fc.weight.packed'", "range [16, +1024) lies outside the 1024-byte", w0});
  expect_invalid(with([&](EngineDesc& d) { d.tensors[packed].offset = ~uint64_t{0} - 15; }),
                 {"tensor 5 'fc.weight.packed'", "lies outside the 1024-byte", w0});
  // The derived weight itself.
  expect_invalid(with([](EngineDesc& d) { d.derived_weights[0].name.clear(); }),
                 {"derived weight 0", "name length 0 is not in [1, 256]"});
  expect_invalid(with([](EngineDesc& d) { d.derived_weights[0].name = "a\nb"; }),
                 {"derived weight 0", "not printable ASCII"});
  expect_invalid(with([&](EngineDesc& d) {
                   d.derived_weights[0].nbytes = 0;
                   d.tensors[packed].shape = {0};
                   d.tensors[packed].nbytes = 0;
                 }),
                 {w0, "0 bytes"});
  expect_invalid(with([](EngineDesc& d) { d.derived_weights[0].nbytes = (uint64_t{64} << 30) + 16; }),
                 {w0, "68719476752 bytes", "past the 68719476736-byte limit"});
  // Each copy.
  expect_invalid(with([&](EngineDesc& d) { copy1(d).source = 99; }),
                 {c1, "source tensor 99 out of range (engine has 6 tensors)"});
  expect_invalid(with([&](EngineDesc& d) { copy1(d).source = 3; }),
                 {c1, "source tensor 3 'fc_out' has storage kind 2; expected an inline (3) or named (4) weight"});
  expect_invalid(with([&](EngineDesc& d) { copy1(d).source = packed; }),
                 {c1, "source tensor 5 'fc.weight.packed' has storage kind 6"});
  expect_invalid(with([&](EngineDesc& d) { copy1(d).rows = 0; }), {c1, "0 rows; expected at least 1"});
  expect_invalid(with([&](EngineDesc& d) { copy1(d).row_bytes = 8; }), {c1, "row_bytes 8; expected at least 16"});
  expect_invalid(with([&](EngineDesc& d) { copy1(d).row_bytes = 24; }),
                 {c1, "row_bytes 24 is not a multiple of 16 bytes"});
  expect_invalid(with([&](EngineDesc& d) { copy1(d).offset = 8; }), {c1, "offset 8 is not a multiple of 16 bytes"});
  expect_invalid(with([&](EngineDesc& d) { copy1(d).stride = 40; }), {c1, "stride 40 is not a multiple of 16 bytes"});
  expect_invalid(with([&](EngineDesc& d) { copy1(d).dst = 260; }), {c1, "dst 260 is not a multiple of 16 bytes"});
  expect_invalid(with([&](EngineDesc& d) {
                   copy1(d).row_bytes = 64;
                   copy1(d).stride = 48;
                 }),
                 {c1, "stride 48 is less than row_bytes 64 (source rows may not overlap)"});
  // fc.weight is 4096 bytes: 8 rows 512 apart from 16 end at 16 + 7 * 512 + 16 = 3616; from 576, 4176.
  expect_invalid(with([&](EngineDesc& d) {
                   copy1(d).stride = 512;
                   copy1(d).offset = 576;
                 }),
                 {c1, "reads 8 rows of 16 bytes, 512 apart, from offset 576 of source tensor 1 'fc.weight'",
                  "expected them within its 4096 bytes"});
  expect_invalid(with([&](EngineDesc& d) { copy1(d).stride = uint64_t{1} << 62; }),
                 {c1, "reads 8 rows of 16 bytes", "expected them within its 4096 bytes"});  // (rows-1) * stride overflows
  expect_invalid(with([&](EngineDesc& d) {
                   copy1(d).rows = 1;
                   copy1(d).offset = ~uint64_t{0} - 15;
                 }),
                 {c1, "expected them within its 4096 bytes"});  // offset + row_bytes overflows
  expect_invalid(with([&](EngineDesc& d) { copy1(d).dst = 1024 - 64; }),
                 {c1, "writes [960, +128): expected it within the 1024-byte derived weight"});
  expect_invalid(with([&](EngineDesc& d) { copy1(d).dst = ~uint64_t{0} - 15; }),
                 {c1, "expected it within the 1024-byte derived weight"});  // dst + bytes overflows
  // A copy in a second derived weight is named by that weight.
  expect_invalid(with([&](EngineDesc& d) {
                   d.derived_weights.push_back(DerivedWeight{"second", 32, {DerivedCopy{1, 0, 0, 16, 1, 32}}});
                 }),
                 {"derived weight 1 'second' copy 0", "writes [16, +32)"});
}

TEST(EngineFormatDerivedWeights, CopyCountIsCapped) {
  SEEDED_RNG(rng);
  EngineDesc d = make_engine(rng);
  add_derived_weight(d);
  const size_t cap = size_t{16} << 20;
  std::vector<DerivedCopy>& copies = d.derived_weights[0].copies;
  copies.assign(cap, DerivedCopy{1, 0, 0, 0, 1, 16});
  EXPECT_TRUE(validate_engine(d).is_ok()) << validate_engine(d).message();
  copies.push_back(copies.back());
  expect_invalid(d, {"derived weight 0 'fc.weight.packed'", "16777217 copies", "limit of 16777216 copies"});
}

// Derived weights stay derived when the inline weights become named: their
// copies name the same tensors (now kNamedWeight) at the same tensor-relative
// offsets, and the engine still validates and round-trips.
TEST(EngineFormatDerivedWeights, ExternalizeKeepsThemDerivedAndTheirSources) {
  SEEDED_RNG(rng);
  EngineDesc d = make_engine(rng);
  add_derived_weight(d);
  const std::vector<DerivedWeight> before = d.derived_weights;
  const uint32_t packed = static_cast<uint32_t>(d.tensors.size() - 1);
  auto split = externalize_weights(&d, "kiln/m/");
  ASSERT_TRUE(split.is_ok()) << split.status().message();
  EXPECT_EQ(d.tensors[1].storage, StorageKind::kNamedWeight);
  EXPECT_EQ(d.tensors[packed].storage, StorageKind::kDerivedWeight);
  EXPECT_EQ(d.named_weights.size(), 2u);  // fc.weight, fc.bias: the derived one is not named
  ASSERT_EQ(d.derived_weights.size(), 1u);
  ASSERT_EQ(d.derived_weights[0].copies.size(), before[0].copies.size());
  for (size_t c = 0; c < before[0].copies.size(); ++c) {
    EXPECT_EQ(d.derived_weights[0].copies[c].source, before[0].copies[c].source);
    EXPECT_EQ(d.derived_weights[0].copies[c].offset, before[0].copies[c].offset);
  }
  // The bytes each copy reads are the same bytes as before.
  const std::vector<uint8_t>& named = split.value()[d.tensors[1].io_index];
  EXPECT_EQ(named.size(), 4096u);
  std::vector<uint8_t> bytes = serialize_ok(d);
  auto parsed = parse_exact(bytes, bytes.size());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().message();
  expect_desc_eq(d, parsed.value());
}

TEST(EngineFormatPersistentKernel, ValidationNamesEachProblem) {
  SEEDED_RNG(rng);
  EngineDesc base = make_engine(rng);
  base.steps[1].kernel.grid[0] = 132;
  base.steps[1].kernel.min_blocks = 66;
  ASSERT_TRUE(validate_engine(base).is_ok()) << validate_engine(base).message();
  EngineDesc d = base;
  d.steps[1].kernel.min_blocks = 133;
  expect_invalid(d, {"step 1 (kernel 'gelu')", "min_blocks 133 exceeds grid[0] 132"});
  d = base;
  d.steps[1].kernel.grid[1] = 2;
  expect_invalid(d, {"step 1 (kernel 'gelu')", "a persistent kernel (min_blocks 66) has grid 132x2x1",
                     "expected grid[1] == grid[2] == 1"});
  d = base;
  d.steps[1].kernel.grid[2] = 3;
  expect_invalid(d, {"step 1 (kernel 'gelu')", "has grid 132x1x3"});
  d = base;
  d.steps[1].kernel.min_blocks = 0;  // a fixed grid may be 2-D
  d.steps[1].kernel.grid[1] = 2;
  EXPECT_TRUE(validate_engine(d).is_ok());
}

}  // namespace
}  // namespace kiln::engine
