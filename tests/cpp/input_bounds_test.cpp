// Index inputs' bounds (engine_format/input_bounds.h, compiler/input_bounds.h): the compiler
// records, for every graph input an op reads as indices, the values PyTorch takes for it; the
// engine format carries them in its metadata; and the check the runtime runs on host inputs
// refuses the first bad element by name. No GPU needed.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "compiler/compiler.h"
#include "compiler/input_bounds.h"
#include "compiler_test_util.h"
#include "engine_format/engine_format.h"
#include "engine_format/input_bounds.h"

namespace kiln {
namespace {

using engine::DType;
using engine::InputBound;
using Shape = std::vector<int64_t>;
using testing::out0;

TEST(InputBounds, TextRoundTripsAndMalformedTextIsNamed) {
  const std::vector<InputBound> bounds = {{0, 0, 32000, "dim 0 (size 32000) of 'embed'"},
                                          {2, -768, 768, "dim 2 (size 768) of state 'k_cache_0'"}};
  Result<std::vector<InputBound>> back = engine::parse_input_bounds(engine::format_input_bounds(bounds), 3);
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  ASSERT_EQ(back.value().size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back.value()[i].input, bounds[i].input);
    EXPECT_EQ(back.value()[i].lo, bounds[i].lo);
    EXPECT_EQ(back.value()[i].hi, bounds[i].hi);
    EXPECT_EQ(back.value()[i].what, bounds[i].what);
  }
  for (const char* bad : {"0 0 10\n", "x 0 10 rows\n", "0 5 5 rows\n", "3 0 10 rows\n", "-1 0 10 rows\n"}) {
    Result<std::vector<InputBound>> r = engine::parse_input_bounds(bad, 3);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruptData);
    EXPECT_NE(r.status().message().find("input_bounds line 1"), std::string::npos) << r.status().message();
  }
}

TEST(InputBounds, CheckRefusesTheFirstBadElementOfEitherIntegerType) {
  const InputBound b{1, -4, 4, "dim 2 (size 4) of state 'k'"};
  const std::vector<int64_t> good64 = {-4, 0, 3};
  EXPECT_TRUE(engine::check_index_values(b, DType::kInt64, good64.data(), 24, "pos").is_ok());
  const std::vector<int64_t> bad64 = {0, 3, 4, 9};
  Status s = engine::check_index_values(b, DType::kInt64, bad64.data(), 32, "pos");
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "input 1 ('pos'): element 2 is 4, outside [-4, 4): it indexes dim 2 (size 4) of state 'k'");
  const std::vector<int32_t> bad32 = {-5};
  s = engine::check_index_values(b, DType::kInt32, bad32.data(), 4, "pos");
  EXPECT_NE(s.message().find("element 0 is -5, outside [-4, 4)"), std::string::npos) << s.message();
  const float f = 1.0f;
  EXPECT_EQ(engine::check_index_values(b, DType::kFloat32, &f, 4, "pos").code(), StatusCode::kInvalidArgument);
}

// tokens (int32, through a view) -> embedding; pos (int64) -> the cache update's positions and,
// through an int64 cast, a table lookup with more rows (the tighter range wins); `shift` reaches
// an index only through arithmetic, which is not traced (no bound).
ir::Graph lm_step_graph(std::mt19937& rng) {
  const DType f = DType::kFloat32;
  ir::Graph g;
  const int tokens = g.add_input("tokens", DType::kInt32, {1, 3});
  const int pos = g.add_input("pos", DType::kInt64, {3});
  const int shift = g.add_input("shift", DType::kInt64, {3});
  const int table = g.add_constant("embed", f, {50, 8}, testing::random_float_bytes(400, rng));
  const int rope = g.add_constant("rope", f, {40, 8}, testing::random_float_bytes(320, rng));
  const int state = g.add_state("k_cache", f, {1, 2, 16, 8}, "kiln/test/state/k_cache");
  const int flat = out0(g, g.add_node("aten.view_copy.default", "flat", {tokens}, {{"size", Shape{3}}},
                                      {{DType::kInt32, {3}}}));
  const int rows = out0(g, g.add_node("aten.embedding.default", "embed_rows", {table, flat}, {}, {{f, {3, 8}}}));
  const int sum = out0(g, g.add_node("aten.add.Tensor", "shifted", {pos, shift}, {}, {{DType::kInt64, {3}}}));
  const int r1 = out0(g, g.add_node("aten.index.Tensor", "rope_rows", {rope, pos}, {}, {{f, {3, 8}}}));
  const int r2 = out0(g, g.add_node("aten.index.Tensor", "rope_shifted", {rope, sum}, {}, {{f, {3, 8}}}));
  const int a = out0(g, g.add_node("aten.add.Tensor", "a", {rows, r1}, {}, {{f, {3, 8}}}));
  const int b = out0(g, g.add_node("aten.add.Tensor", "b", {a, r2}, {}, {{f, {3, 8}}}));
  const int values = out0(g, g.add_node("aten.view_copy.default", "values", {b}, {{"size", Shape{1, 1, 3, 8}}},
                                        {{f, {1, 1, 3, 8}}}));
  const int wide = out0(g, g.add_node("aten.expand_copy.default", "wide", {values}, {{"size", Shape{1, 2, 3, 8}}},
                                      {{f, {1, 2, 3, 8}}}));
  const int upd = out0(g, g.add_node("aten.index_put.default", "update", {state, pos, wide},
                                     {{"indices_count", int64_t{1}}, {"indices_positions", Shape{2}}, {"accumulate", false}},
                                     {{f, {1, 2, 16, 8}}}));
  g.set_state_update(state, upd);
  g.set_outputs({b});
  return g;
}

TEST(InputBounds, TheCompilerRecordsIndexInputsInTheEngine) {
  std::mt19937 rng(std::random_device{}());
  const ir::Graph g = lm_step_graph(rng);
  const std::vector<InputBound> found = compiler::input_index_bounds(g);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].input, 0u);
  EXPECT_EQ(found[0].lo, 0);
  EXPECT_EQ(found[0].hi, 50);
  EXPECT_EQ(found[0].what, "dim 0 (size 50) of 'embed'");
  EXPECT_EQ(found[1].input, 1u);  // [-40, 40) of the table and [-16, 16) of the cache
  EXPECT_EQ(found[1].lo, -16);
  EXPECT_EQ(found[1].hi, 16);
  EXPECT_EQ(found[1].what, "dim 2 (size 16) of state 'k_cache'");

  // Through the whole pipeline: the engine carries them, and the format validates them.
  engine::EngineDesc desc = compiler::compile_to_desc(g, {});
  const std::string* text = desc.find_metadata(engine::kInputBoundsKey);
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(*text, "0 0 50 dim 0 (size 50) of 'embed'\n1 -16 16 dim 2 (size 16) of state 'k_cache'\n");
  Result<std::vector<uint8_t>> bytes = engine::serialize_engine(desc);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().message();
  Result<engine::EngineDesc> back = engine::parse_engine(bytes.value().data(), bytes.value().size());
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(*back.value().find_metadata(engine::kInputBoundsKey), *text);

  // A bound naming no input, or a float input, is not a valid engine.
  auto tampered = [&](const char* text, bool float_shift) {
    engine::EngineDesc d = desc;
    for (auto& kv : d.metadata)
      if (kv.first == engine::kInputBoundsKey) kv.second = text;
    if (float_shift) {  // 'shift' as 6 float32s: its 24 bytes stay as they are
      d.tensors[d.inputs[2]].dtype = DType::kFloat32;
      d.tensors[d.inputs[2]].shape = {6};
    }
    return engine::validate_engine(d);
  };
  Status s = tampered("7 0 4 rows\n", false);
  EXPECT_NE(s.message().find("input_bounds line 1: input 7 of 3"), std::string::npos) << s.message();
  s = tampered("2 0 4 rows\n", true);
  EXPECT_NE(s.message().find("input_bounds: input 2 is float32, not an integer index"), std::string::npos) << s.message();
  EXPECT_TRUE(tampered("2 0 4 rows\n", false).is_ok());
}

}  // namespace
}  // namespace kiln
