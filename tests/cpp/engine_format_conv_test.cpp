// Engine format v2 additions: conv steps and batched GEMMs. Round trip,
// version refusal and one test per validation rule (each error must name
// the problem).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine_format/engine_format.h"
#include "engine_format/engine_layout.h"

namespace kiln::engine {
namespace {

bool contains(const std::string& s, const std::string& sub) {
  return s.find(sub) != std::string::npos;
}

void add_tensor(EngineDesc& d, const char* name, DType dtype, std::vector<int64_t> shape,
                StorageKind storage, uint32_t io_index, uint64_t offset) {
  TensorDesc t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.storage = storage;
  t.io_index = io_index;
  t.offset = offset;
  t.nbytes = dtype_size(dtype);
  for (int64_t s : t.shape) t.nbytes *= static_cast<uint64_t>(s);
  d.tensors.push_back(t);
}

// out = relu(conv(x, w; stride 2, pad 1, groups 2) + bias + z), fp16, then
// a batched GEMM y2 = out2d @ W2 with W2 broadcast over the batch.
EngineDesc make_conv_engine() {
  EngineDesc d;
  const DType h = DType::kFloat16;
  add_tensor(d, "x", h, {2, 8, 8, 4}, StorageKind::kInput, 0, 0);        // 0
  add_tensor(d, "w", h, {6, 3, 3, 2}, StorageKind::kWeight, 0, 0);       // 1: 216 B
  add_tensor(d, "bias", h, {6}, StorageKind::kWeight, 0, 256);           // 2
  add_tensor(d, "z", h, {2, 4, 4, 6}, StorageKind::kInput, 1, 0);        // 3
  add_tensor(d, "conv_out", h, {2, 4, 4, 6}, StorageKind::kArena, 0, 0); // 4: 384 B
  add_tensor(d, "w2", h, {6, 5}, StorageKind::kWeight, 0, 512);          // 5
  add_tensor(d, "y", h, {2, 16, 5}, StorageKind::kOutput, 0, 0);         // 6
  d.inputs = {0, 3};
  d.outputs = {6};
  d.arena_bytes = 512;
  d.weights.assign(1024, 0x3c);

  Step conv;
  conv.kind = StepKind::kConv;
  conv.label = "conv2d+add+relu";
  ConvStep& c = conv.conv;
  c.x = 0;
  c.w = 1;
  c.bias = 2;
  c.z = 3;
  c.out = 4;
  c.n = 2, c.h = 8, c.w_in = 8, c.c = 4;
  c.k = 6, c.r = 3, c.s = 3, c.p = 4, c.q = 4;
  c.pad_h = 1, c.pad_w = 1, c.stride_h = 2, c.stride_w = 2;
  c.groups = 2;
  c.activation = ConvActivation::kRelu;
  d.steps.push_back(conv);

  Step bmm;
  bmm.kind = StepKind::kGemm;
  bmm.label = "bmm";
  GemmStep& g = bmm.gemm;
  g.a = 4;
  g.b = 5;
  g.out = 6;
  g.m = 16, g.n = 5, g.k = 6;
  g.batch = 2;
  g.stride_a = 16 * 6;
  g.stride_b = 0;  // broadcast
  g.stride_out = 16 * 5;
  d.steps.push_back(bmm);
  return d;
}

#define EXPECT_MESSAGE_HAS(status, sub) \
  EXPECT_TRUE(contains((status).message(), sub)) << "message: " << (status).message()

void expect_invalid(const EngineDesc& d, std::initializer_list<const char*> subs) {
  Status st = validate_engine(d);
  ASSERT_FALSE(st.is_ok()) << "expected an error naming: " << *subs.begin();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  for (const char* sub : subs) EXPECT_MESSAGE_HAS(st, sub);
}

EngineDesc with(const std::function<void(EngineDesc&)>& edit) {
  EngineDesc d = make_conv_engine();
  edit(d);
  return d;
}

TEST(EngineFormatConv, BaseEngineIsValid) {
  Status st = validate_engine(make_conv_engine());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

// x (or z, out) stored under a shape that differs only in dims of size 1:
// a conv over a view of an engine input, such as a [1, 4000] waveform read
// as [1, 1, 4000, 1]. The same elements in another order (NCHW for NHWC)
// are refused; the filter and bias shapes stay exact.
TEST(EngineFormatConv, ActivationsMayDifferInUnitDims) {
  EngineDesc d = make_conv_engine();
  const std::vector<int64_t> x = d.tensors[0].shape;  // NHWC
  ASSERT_EQ(x.size(), 4u);
  d.tensors[0].shape = {x[0], 1, x[1], x[2], 1, x[3]};
  Status st = validate_engine(d);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  d.tensors[0].shape = {x[0], x[3], x[1], x[2]};  // NCHW: as many elements, another order
  expect_invalid(d, {"conv x tensor 0 'x' has shape", "differs only in dims of size 1"});
}

TEST(EngineFormatConv, RoundTripKeepsConvAndBatchFields) {
  EngineDesc d = make_conv_engine();
  d.steps[0].conv.dilation_h = 1;
  auto bytes = serialize_engine(d);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto parsed = parse_engine(bytes->data(), bytes->size());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  ASSERT_EQ(parsed->steps.size(), 2u);
  const ConvStep &a = d.steps[0].conv, &b = parsed->steps[0].conv;
  EXPECT_EQ(parsed->steps[0].kind, StepKind::kConv);
  EXPECT_EQ(parsed->steps[0].label, "conv2d+add+relu");
  EXPECT_EQ(std::vector<uint32_t>({a.x, a.w, a.bias, a.z, a.out}),
            std::vector<uint32_t>({b.x, b.w, b.bias, b.z, b.out}));
  EXPECT_EQ(std::vector<int64_t>({a.n, a.h, a.w_in, a.c, a.k, a.r, a.s, a.p, a.q, a.pad_h,
                                  a.pad_w, a.stride_h, a.stride_w, a.dilation_h, a.dilation_w,
                                  a.groups}),
            std::vector<int64_t>({b.n, b.h, b.w_in, b.c, b.k, b.r, b.s, b.p, b.q, b.pad_h,
                                  b.pad_w, b.stride_h, b.stride_w, b.dilation_h, b.dilation_w,
                                  b.groups}));
  EXPECT_EQ(a.activation, b.activation);
  const GemmStep &g = d.steps[1].gemm, &h = parsed->steps[1].gemm;
  EXPECT_EQ(std::vector<int64_t>({g.batch, g.stride_a, g.stride_b, g.stride_c, g.stride_out}),
            std::vector<int64_t>({h.batch, h.stride_a, h.stride_b, h.stride_c, h.stride_out}));
  // Canonical: the parsed engine serializes to the same bytes.
  auto again = serialize_engine(parsed.value());
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(bytes.value(), again.value());
}

TEST(EngineFormatConv, EveryTruncationFails) {
  auto bytes = serialize_engine(make_conv_engine());
  ASSERT_TRUE(bytes.is_ok());
  for (size_t len = 0; len < bytes->size(); ++len) {
    auto r = parse_engine(bytes->data(), len);
    ASSERT_FALSE(r.is_ok()) << "length " << len;
  }
}

TEST(EngineFormatConv, OlderVersionIsRefusedWithAHint) {
  auto bytes = serialize_engine(make_conv_engine());
  ASSERT_TRUE(bytes.is_ok());
  std::vector<uint8_t> b = bytes.value();
  const uint32_t old_version = 1;
  std::memcpy(&b[layout::kVersionOffset], &old_version, 4);  // little-endian host
  auto r = parse_engine(b.data(), b.size());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIncompatible);
  EXPECT_MESSAGE_HAS(r.status(), "engine format version 1, this runtime reads version " +
                                     std::to_string(kEngineFormatVersion));
  EXPECT_MESSAGE_HAS(r.status(), "re-export");
}

TEST(EngineFormatConv, ValidationNamesEachProblem) {
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.x = 40; }),
                 {"step 0 (conv 'conv2d+add+relu')", "conv x tensor 40 out of range"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.out = kNoTensor; }),
                 {"conv out tensor"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.z = 99; }), {"conv z tensor 99"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.activation = static_cast<ConvActivation>(7); }),
                 {"activation 7"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.stride_w = 0; }), {"stride 2x0"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.dilation_h = -1; }), {"dilation -1x1"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.pad_h = -1; }), {"padding -1x1"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.groups = 0; }),
                 {"conv groups is 0"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.groups = 3; }),
                 {"groups 3 must divide both c=4 and k=6"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.p = 5; }),
                 {"conv output 5x4", "give 4x4"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.r = 13; }),
                 {"dilated filter height 13 is larger than the padded input 10"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.dilation_w = int64_t{1} << 62; }),
                 {"width extent overflows"});
  expect_invalid(with([](EngineDesc& d) {
                   // groups 1 needs w [6, 3, 3, 4]
                   d.steps[0].conv.groups = 1;
                 }),
                 {"conv w tensor 1 'w' has shape [6, 3, 3, 2], expected [6, 3, 3, 4]"});
  expect_invalid(with([](EngineDesc& d) {
                   d.tensors[2].shape = {1, 6};
                 }),
                 {"conv bias tensor 2 'bias' has shape [1, 6], expected [6]"});
  expect_invalid(with([](EngineDesc& d) {
                   d.tensors[3].shape = {2, 4, 4, 5};
                   d.tensors[3].nbytes = 2 * 4 * 4 * 5 * 2;
                 }),
                 {"conv z tensor 3 'z' has shape [2, 4, 4, 5], expected [2, 4, 4, 6] (or one that differs only"});
  expect_invalid(with([](EngineDesc& d) {
                   d.tensors[2].dtype = DType::kFloat32;
                   d.tensors[2].nbytes = 24;
                 }),
                 {"conv bias tensor 2 'bias' is float32 but x is float16"});
  expect_invalid(with([](EngineDesc& d) {
                   for (uint32_t t : {0u, 1u, 2u, 3u, 4u}) {
                     d.tensors[t].dtype = DType::kInt32;
                     d.tensors[t].nbytes *= 2;
                   }
                   d.arena_bytes = 1024;
                   d.weights.resize(2048);
                   d.tensors[2].offset = 512;
                   d.steps.pop_back();
                 }),
                 {"conv x tensor 0 'x' is int32", "float32, float16 or bfloat16"});
  expect_invalid(with([](EngineDesc& d) { d.steps[0].conv.out = 5; }),
                 {"conv out tensor 5 'w2' has shape"});
}

TEST(EngineFormatConv, ValidationChecksAliasing) {
  // x in the arena overlapping out.
  EngineDesc d = make_conv_engine();
  add_tensor(d, "x_arena", DType::kFloat16, {2, 8, 8, 4}, StorageKind::kArena, 0, 128);
  d.arena_bytes = 128 + 1024;
  d.steps[0].conv.x = 7;
  expect_invalid(d, {"conv x tensor 7 overlaps out tensor 4"});

  // z partly over out: refused; z exactly out's memory: accepted (in place).
  d = make_conv_engine();
  add_tensor(d, "z_arena", DType::kFloat16, {2, 4, 4, 6}, StorageKind::kArena, 0, 64);
  d.arena_bytes = 64 + 384;
  d.steps[0].conv.z = 7;
  expect_invalid(d, {"conv z tensor 7 partly overlaps out tensor 4"});
  d.tensors[7].offset = 0;
  Status st = validate_engine(d);
  EXPECT_TRUE(st.is_ok()) << st.to_string();

  d = make_conv_engine();
  d.steps[0].conv.out = 1;
  d.tensors[1].shape = {2, 4, 4, 6};
  d.tensors[1].nbytes = 384;
  d.steps[0].conv.w = 5;
  expect_invalid(d, {"conv"});  // shape error first; a weight out is also refused
}

TEST(EngineFormatConv, OptionalOperandsMayBeAbsent) {
  EngineDesc d = make_conv_engine();
  d.steps[0].conv.bias = kNoTensor;
  d.steps[0].conv.z = kNoTensor;
  d.steps[0].conv.activation = ConvActivation::kNone;
  Status st = validate_engine(d);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

TEST(EngineFormatBatchedGemm, ValidationNamesEachProblem) {
  expect_invalid(with([](EngineDesc& d) { d.steps[1].gemm.batch = 0; }), {"batch 0 must be 1.."});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].gemm.batch = int64_t{1} << 40; }),
                 {"batch 1099511627776"});
  expect_invalid(with([](EngineDesc& d) {
                   d.steps[1].gemm.batch = 1;
                   d.steps[1].gemm.m = 32;
                 }),
                 {"stride_a is 96 but batch is 1"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].gemm.stride_b = -30; }),
                 {"stride_b -30 is negative"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].gemm.stride_out = 79; }),
                 {"stride_out 79 is smaller than one [16, 5] output matrix"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].gemm.stride_a = 97; }),
                 {"gemm a tensor 4 'conv_out' has 192 elements", "reach 193"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].gemm.stride_b = 1; }),
                 {"gemm b tensor 5 'w2' has 30 elements"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].gemm.stride_c = 4; }),
                 {"stride_c 4 set but there is no c"});
  expect_invalid(with([](EngineDesc& d) { d.steps[1].gemm.stride_a = INT64_MAX; }),
                 {"gemm a extent", "overflows"});
  expect_invalid(with([](EngineDesc& d) { d.tensors[6].shape = {2, 10, 8}; }),
                 {"gemm out tensor 6 'y'", "does not split into rows of 5"});
  expect_invalid(with([](EngineDesc& d) {
                   d.tensors[6].shape = {2, 10, 7};
                   d.tensors[6].nbytes = 2 * 10 * 7 * 2;  // float16
                 }),
                 {"gemm out tensor 6 'y' has 140 elements"});
}

}  // namespace
}  // namespace kiln::engine
