// The whole compiler on real graphs: passes, NVRTC, lowering, serialization.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "compiler/compiler.h"
#include "compiler_test_util.h"
#include "engine_format/engine_format.h"

namespace kiln {
namespace {

using engine::DType;

class CompilerPipeline : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  unsigned seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(CompilerPipeline, MlpBecomesThreeGemmsAndOneFusedKernel) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  ir::Graph g = testing::make_mlp_graph(8, 64, 128, 16, rng_);
  compiler::CompileOptions options;
  std::vector<std::string> progress;
  options.progress = [&](const std::string& m) { progress.push_back(m); };
  engine::EngineDesc d = compiler::compile_to_desc(g, options);

  ASSERT_EQ(d.steps.size(), 4u);
  EXPECT_EQ(testing::count_kind(d, engine::StepKind::kGemm), 3u);
  EXPECT_EQ(d.steps[0].gemm.epilogue, engine::GemmEpilogue::kBias);
  EXPECT_EQ(d.steps[1].kind, engine::StepKind::kKernel);
  EXPECT_EQ(d.steps[1].label, "gelu");
  EXPECT_EQ(d.steps[2].gemm.epilogue, engine::GemmEpilogue::kReluBias) << "ReLU folds into the GEMM epilogue";
  EXPECT_EQ(d.steps[2].label, "addmm+relu");
  for (const auto& s : d.steps)
    if (s.kind == engine::StepKind::kGemm) EXPECT_TRUE(s.gemm.b_transposed);
  // The final GEMM writes the engine output directly.
  EXPECT_EQ(d.steps[3].gemm.out, d.outputs[0]);
  EXPECT_EQ(d.tensors[d.outputs[0]].storage, engine::StorageKind::kOutput);
  // Intermediates [8,128] fp32 = 4096 bytes; three of them, two alive at once.
  EXPECT_EQ(d.arena_bytes, 2u * 4096u);

  ASSERT_EQ(d.modules.size(), 1u);
  // The default targets: every SM from 80 to 120 NVRTC 13 builds for, PTX for the oldest.
  const std::vector<uint32_t> default_sms = {80, 86, 87, 89, 90, 100, 110, 120};
  ASSERT_EQ(d.modules[0].cubins.size(), default_sms.size());
  for (size_t i = 0; i < default_sms.size(); ++i) EXPECT_EQ(d.modules[0].cubins[i].sm, default_sms[i]);
  for (const auto& c : d.modules[0].cubins) {
    ASSERT_GT(c.image.size(), 4u);
    EXPECT_EQ(std::memcmp(c.image.data(), "\x7f" "ELF", 4), 0) << "a cubin is an ELF image";
  }
  EXPECT_EQ(d.modules[0].ptx_sm, 80u);
  EXPECT_EQ(*d.find_metadata("target_sms"), "80,86,87,89,90,100,110,120");
  EXPECT_NE(d.modules[0].ptx.find(".entry kiln_pw_0"), std::string::npos);
  EXPECT_FALSE(progress.empty());
  ASSERT_NE(d.find_metadata("precision"), nullptr);
  EXPECT_EQ(*d.find_metadata("precision"), "float32");
}

TEST_F(CompilerPipeline, WeightsKeepNnLinearLayoutAfterFoldingTheTranspose) {
  ir::Graph g = testing::make_mlp_graph(2, 8, 16, 4, rng_);
  const ir::Value* fc1_weight = nullptr;
  for (const auto& v : g.values())
    if (v.name == "fc1_weight") fc1_weight = &v;
  ASSERT_NE(fc1_weight, nullptr);
  std::vector<uint8_t> original = fc1_weight->data;
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  const engine::TensorDesc& b = d.tensors[d.steps[0].gemm.b];
  ASSERT_EQ(b.storage, engine::StorageKind::kWeight);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{16, 8}));
  ASSERT_EQ(b.nbytes, original.size());
  EXPECT_EQ(std::memcmp(d.weights.data() + b.offset, original.data(), original.size()), 0);
}

TEST_F(CompilerPipeline, Float16PrecisionCastsAtTheEdges) {
  ir::Graph g = testing::make_mlp_graph(4, 32, 64, 8, rng_);
  compiler::CompileOptions options;
  options.enabled_precisions = {DType::kFloat32, DType::kFloat16};
  engine::EngineDesc d = compiler::compile_to_desc(g, options);
  EXPECT_EQ(d.tensors[d.inputs[0]].dtype, DType::kFloat32);
  EXPECT_EQ(d.tensors[d.outputs[0]].dtype, DType::kFloat32);
  for (const auto& s : d.steps)
    if (s.kind == engine::StepKind::kGemm) EXPECT_EQ(d.tensors[s.gemm.a].dtype, DType::kFloat16);
  EXPECT_EQ(d.steps.front().label, "cast") << "the fp32 input is cast before the first GEMM";
  EXPECT_EQ(d.steps.back().label, "cast") << "the fp16 result is cast back to fp32";
  EXPECT_EQ(*d.find_metadata("precision"), "float16");
  // Weights are stored in half precision.
  const engine::TensorDesc& w = d.tensors[d.steps[1].gemm.b];
  EXPECT_EQ(w.dtype, DType::kFloat16);
}

TEST_F(CompilerPipeline, BroadcastAddFusesWithActivation) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {4, 6});
  int b = g.add_constant("b", DType::kFloat32, {6}, testing::random_float_bytes(6, rng_));
  int add = g.add_node("aten.add.Tensor", "add", {x, b}, {{"alpha", 2.0}}, {{DType::kFloat32, {4, 6}}});
  int sig = g.add_node("aten.sigmoid.default", "sig", {g.nodes()[add].outputs[0]}, {}, {{DType::kFloat32, {4, 6}}});
  int mul = g.add_node("aten.mul.Scalar", "scale", {g.nodes()[sig].outputs[0]}, {{"other", 0.5}},
                       {{DType::kFloat32, {4, 6}}});
  g.set_outputs({g.nodes()[mul].outputs[0]});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  ASSERT_EQ(d.steps.size(), 1u);
  EXPECT_EQ(d.steps[0].label, "add+sigmoid+mul");
  const std::string& src = d.modules[0].source;
  EXPECT_NE(src.find("% 6LL"), std::string::npos) << src;  // bias indexed by the last dim
  EXPECT_NE(src.find("2.000000000e+00f"), std::string::npos) << "alpha is applied";
  EXPECT_EQ(d.arena_bytes, 0u);
}

// fp16 SiLU as exported: y = cast16(c * sigmoid(c)), c = cast32(x). The cast
// feeds two ops of the same kernel, so it fuses too: one kernel, not two.
TEST_F(CompilerPipeline, SharedProducerFusesWhenAllItsConsumersDo) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat16, {4, 6});
  int up = g.add_node("aten._to_copy.default", "up", {x}, {}, {{DType::kFloat32, {4, 6}}});
  int c = g.nodes()[up].outputs[0];
  int sig = g.add_node("aten.sigmoid.default", "sig", {c}, {}, {{DType::kFloat32, {4, 6}}});
  int mul = g.add_node("aten.mul.Tensor", "mul", {c, g.nodes()[sig].outputs[0]}, {}, {{DType::kFloat32, {4, 6}}});
  int down = g.add_node("aten._to_copy.default", "down", {g.nodes()[mul].outputs[0]}, {},
                        {{DType::kFloat16, {4, 6}}});
  g.set_outputs({g.nodes()[down].outputs[0]});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  ASSERT_EQ(d.steps.size(), 1u) << "the leading cast is not a kernel of its own";
  EXPECT_EQ(d.steps[0].label, "_to_copy+sigmoid+mul+_to_copy");
  EXPECT_EQ(d.steps[0].kernel.args.size(), 3u) << "out, x, count: the cast's result is not read from memory";
  EXPECT_EQ(d.arena_bytes, 0u);

  // A producer whose value also leaves the kernel stays a kernel of its own.
  ir::Graph h = g;
  h.set_outputs({h.nodes()[down].outputs[0], c});
  engine::EngineDesc e = compiler::compile_to_desc(h, {});
  EXPECT_EQ(e.steps.size(), 2u);
}

TEST_F(CompilerPipeline, OutputThatIsAnInputIsCopied) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat16, {3, 5});
  int v = g.add_node("aten.view_copy.default", "flat", {x}, {{"size", std::vector<int64_t>{15}}},
                     {{DType::kFloat16, {15}}});
  g.set_outputs({g.nodes()[v].outputs[0]});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  ASSERT_EQ(d.steps.size(), 1u);
  EXPECT_EQ(d.steps[0].label, "copy");
  EXPECT_EQ(d.tensors[d.outputs[0]].shape, (std::vector<int64_t>{15}));
}

TEST_F(CompilerPipeline, SerializedEngineParsesBack) {
  ir::Graph g = testing::make_mlp_graph(2, 16, 32, 4, rng_);
  compiler::CompileOptions options;
  options.use_cuda_graphs = 1;
  std::vector<uint8_t> bytes = compiler::compile_graph(g, options);
  Result<engine::EngineDesc> parsed = engine::parse_engine(bytes.data(), bytes.size());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed.value().steps.size(), 4u);
  ASSERT_NE(parsed.value().find_metadata("use_cuda_graphs"), nullptr);
  EXPECT_EQ(*parsed.value().find_metadata("use_cuda_graphs"), "true");
}

// An engine with many distinct kernels compiles them as a few modules of
// about equal size (in parallel); each kernel step names the module that
// defines its function, the split depends on the kernels only (the same
// engine twice), and the engine validates and parses back.
TEST_F(CompilerPipeline, ManyKernelsSplitIntoModulesThatEachDefineTheirSteps) {
  auto graph = [](int outputs) {
    ir::Graph g;
    const int x = g.add_input("x", DType::kFloat32, {4, 32});
    std::vector<int> outs;
    for (int i = 0; i < outputs; ++i) {  // a different constant each: distinct kernels
      const int n = g.add_node("aten.mul.Scalar", "scale" + std::to_string(i), {x}, {{"other", 0.25 + i}},
                               {{DType::kFloat32, {4, 32}}});
      outs.push_back(g.nodes()[static_cast<size_t>(n)].outputs[0]);
    }
    g.set_outputs(outs);
    return g;
  };
  compiler::CompileOptions options;
  options.target_sms = {90};
  engine::EngineDesc few = compiler::compile_to_desc(graph(20), options);
  ASSERT_EQ(few.modules.size(), 1u);
  EXPECT_EQ(few.modules[0].name, "kiln_kernels");

  engine::EngineDesc d = compiler::compile_to_desc(graph(200), options);
  ASSERT_EQ(d.modules.size(), 3u) << "200 distinct kernels: 64 or more a module";
  std::vector<size_t> steps_in(d.modules.size(), 0);
  for (const engine::Step& s : d.steps) {
    ASSERT_EQ(s.kind, engine::StepKind::kKernel);
    ASSERT_LT(s.kernel.module, d.modules.size());
    const engine::KernelModule& m = d.modules[s.kernel.module];
    EXPECT_NE(m.source.find(s.kernel.function + "("), std::string::npos) << s.kernel.function << " in " << m.name;
    EXPECT_NE(m.ptx.find(".entry " + s.kernel.function), std::string::npos);
    ++steps_in[s.kernel.module];
    for (size_t other = 0; other < d.modules.size(); ++other)
      if (other != s.kernel.module)
        EXPECT_EQ(d.modules[other].source.find(s.kernel.function + "("), std::string::npos)
            << s.kernel.function << " is defined twice";
  }
  for (size_t i = 0; i < d.modules.size(); ++i) {
    EXPECT_EQ(d.modules[i].name, "kiln_kernels_" + std::to_string(i));
    EXPECT_GE(steps_in[i], 60u) << "modules of about equal size";
    ASSERT_EQ(d.modules[i].cubins.size(), 1u);
    EXPECT_EQ(d.modules[i].cubins[0].sm, 90u);
  }
  Result<std::vector<uint8_t>> bytes = engine::serialize_engine(d);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  Result<engine::EngineDesc> parsed = engine::parse_engine(bytes.value().data(), bytes.value().size());
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed.value().modules.size(), 3u);
  Result<std::vector<uint8_t>> again = engine::serialize_engine(compiler::compile_to_desc(graph(200), options));
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again.value(), bytes.value()) << "the split must not depend on the machine or the run";
}

TEST_F(CompilerPipeline, PermuteOfAnActivationIsReadThroughStridesByTheElementwiseKernel) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {2, 3, 5});
  int p = g.add_node("aten.permute_copy.default", "perm", {x}, {{"dims", std::vector<int64_t>{2, 0, 1}}},
                     {{DType::kFloat32, {5, 2, 3}}});
  int e = g.add_node("aten.hardswish.default", "hs", {g.nodes()[p].outputs[0]}, {}, {{DType::kFloat32, {5, 2, 3}}});
  g.set_outputs({g.nodes()[e].outputs[0]});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  // No permute kernel: hardswish reads x through the permute's strides.
  ASSERT_EQ(d.steps.size(), 1u);
  EXPECT_EQ(d.steps[0].label, "hardswish");
  ASSERT_EQ(d.steps[0].kernel.args.size(), 3u);  // out, x, n
  EXPECT_EQ(d.steps[0].kernel.args[1].tensor, d.inputs[0]);
  // out[a][b][c] = in[b][c][a]: out dim 0 (size 5) is input dim 2 (stride 1),
  // out dim 1 is input dim 0 (stride 15), out dim 2 is input dim 1 (stride 5).
  const std::string& src = d.modules[0].source;
  EXPECT_NE(src.find("((i / 6LL) % 5LL) * 1LL"), std::string::npos) << src;
  EXPECT_NE(src.find("((i / 3LL) % 2LL) * 15LL"), std::string::npos) << src;
  EXPECT_NE(src.find("((i / 1LL) % 3LL) * 5LL"), std::string::npos) << src;
}

TEST_F(CompilerPipeline, CatAndSplitBecomeOneLayoutKernelPerPiece) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {4, 3});
  int y = g.add_input("y", DType::kFloat32, {4, 5});
  int cat = g.add_node("aten.cat.default", "cat", {x, y}, {{"dim", int64_t{1}}, {"tensors_count", int64_t{2}}},
                       {{DType::kFloat32, {4, 8}}});
  int split = g.add_node("aten.split_with_sizes_copy.default", "split", {g.nodes()[cat].outputs[0]},
                         {{"split_sizes", std::vector<int64_t>{6, 2}}, {"dim", int64_t{1}}},
                         {{DType::kFloat32, {4, 6}}, {DType::kFloat32, {4, 2}}});
  g.set_outputs(g.nodes()[split].outputs);
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  ASSERT_EQ(d.steps.size(), 4u);
  EXPECT_EQ(d.steps[0].label, "cat");
  EXPECT_EQ(d.steps[2].label, "slice_copy");  // each piece of the split is a slice (splits_to_slices)
  const std::string& src = d.modules[0].source;
  // y lands at column 3 of the [4, 8] result: base 3, row stride 8.
  EXPECT_NE(src.find("out[3LL + ((i / 1LL) % 5LL) * 1LL + ((i / 5LL) % 4LL) * 8LL]"), std::string::npos) << src;
  // The second split piece starts at column 6.
  EXPECT_NE(src.find("in0[6LL + ((i / 1LL) % 2LL) * 1LL + ((i / 2LL) % 4LL) * 8LL]"), std::string::npos) << src;
  EXPECT_EQ(d.arena_bytes, 256u) << "the [4, 8] cat result lives in the arena (one 256-byte slot)";
}

// A fused projection's chunks (Phi-3's gate|up, GPT-2's c_attn): each piece of the split is read
// in place by the arithmetic that uses it, with no layout kernel, whether the split gives its sizes
// or one chunk size.
TEST_F(CompilerPipeline, SplitPiecesAreReadInPlaceByTheirElementwiseReaders) {
  for (const bool sizes : {true, false}) {
    SCOPED_TRACE(sizes ? "split_with_sizes_copy" : "split_copy");
    ir::Graph g;
    int x = g.add_input("x", DType::kFloat32, {4, 12});
    std::map<std::string, ir::Attr> attrs = {{"dim", int64_t{-1}}};
    if (sizes)
      attrs["split_sizes"] = std::vector<int64_t>{4, 4, 4};
    else
      attrs["split_size"] = int64_t{4};
    int split = g.add_node(sizes ? "aten.split_with_sizes_copy.default" : "aten.split_copy.Tensor", "split", {x},
                           attrs, {{DType::kFloat32, {4, 4}}, {DType::kFloat32, {4, 4}}, {DType::kFloat32, {4, 4}}});
    std::vector<int> outs;
    for (int i = 0; i < 3; ++i)
      outs.push_back(g.nodes()[g.add_node("aten.relu.default", "r" + std::to_string(i), {g.nodes()[split].outputs[i]},
                                          {}, {{DType::kFloat32, {4, 4}}})]
                         .outputs[0]);
    g.set_outputs(outs);
    engine::EngineDesc d = compiler::compile_to_desc(g, {});
    ASSERT_EQ(d.steps.size(), 3u);
    for (const engine::Step& step : d.steps) {
      EXPECT_EQ(step.label, "relu");
      EXPECT_EQ(step.kernel.args[1].tensor, d.inputs[0]) << "reads x itself";
    }
    // The third piece starts at column 8 of x's rows of 12.
    const std::string& src = d.modules[0].source;
    EXPECT_NE(src.find("in0[8LL + ((i / 1LL) % 4LL) * 1LL + ((i / 4LL) % 4LL) * 12LL]"), std::string::npos) << src;
  }
}

TEST_F(CompilerPipeline, ReductionsGenerateWarpKernels) {
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat16, {2, 3, 5, 7});
  int mean = g.add_node("aten.mean.dim", "pool", {x}, {{"dim", std::vector<int64_t>{-1, 2}}, {"keepdim", true}},
                        {{DType::kFloat16, {2, 3, 1, 1}}});
  int amax = g.add_node("aten.amax.default", "mx", {x}, {{"dim", std::vector<int64_t>{1}}}, {{DType::kFloat16, {2, 5, 7}}});
  g.set_outputs({g.nodes()[mean].outputs[0], g.nodes()[amax].outputs[0]});
  engine::EngineDesc d = compiler::compile_to_desc(g, {});
  ASSERT_EQ(d.steps.size(), 2u);
  EXPECT_EQ(d.steps[0].kernel.grid[0], 1u) << "6 outputs fit one block of 8 warps";
  // amax over the channels of [2, 3, 5, 7]: 35 kept elements inside the
  // reduced dim, so the column form (a thread per inner element, coalesced).
  EXPECT_EQ(d.steps[1].kernel.grid[0], 2u) << "35 inner elements, 32 per block";
  EXPECT_EQ(d.steps[1].kernel.grid[1], 2u) << "one block row per outer index";
  EXPECT_EQ(d.steps[1].kernel.block[1], 8u);
  const std::string& src = d.modules[0].source;
  EXPECT_NE(src.find("acc / 35.0f"), std::string::npos) << src;
  EXPECT_NE(src.find("kiln_maximum(acc, v)"), std::string::npos) << src;
  EXPECT_NE(src.find("r < 3LL"), std::string::npos) << "amax walks the 3 channels";
}

TEST(CompilerSupport, TakesKnownOpsAndExplainsRefusals) {
  compiler::OpQuery addmm{"aten.addmm.default",
                          {{DType::kFloat32, {32}, true}, {DType::kFloat32, {8, 16}, false}, {DType::kFloat32, {16, 32}, true}},
                          {},
                          {{DType::kFloat32, {8, 32}, false}}};
  EXPECT_FALSE(compiler::check_support(addmm).has_value());

  compiler::OpQuery flip{"aten.flip.default", {{DType::kFloat32, {8, 32}, false}}, {{"dims", std::vector<int64_t>{1}}},
                         {{DType::kFloat32, {8, 32}, false}}};
  auto why = compiler::check_support(flip);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("aten.flip.default"), std::string::npos);

  compiler::OpQuery permute{"aten.permute_copy.default", {{DType::kFloat32, {8, 32}, false}},
                            {{"dims", std::vector<int64_t>{1, 0}}}, {{DType::kFloat32, {32, 8}, false}}};
  EXPECT_FALSE(compiler::check_support(permute).has_value()) << "a gather kernel for activations";
  permute.inputs[0].is_constant = true;
  EXPECT_FALSE(compiler::check_support(permute).has_value()) << "folded at export for weights";

  // Integer adds are taken (exact int64 arithmetic); an integer result the
  // elementwise kernel does not compute is refused, naming the dtype.
  compiler::OpQuery ints{"aten.add.Tensor", {{DType::kInt64, {4}, false}, {DType::kInt64, {4}, false}}, {},
                         {{DType::kInt64, {4}, false}}};
  EXPECT_FALSE(compiler::check_support(ints).has_value());
  ints.op = "aten.pow.Tensor_Tensor";
  ASSERT_TRUE(compiler::check_support(ints).has_value());
  EXPECT_NE(compiler::check_support(ints)->find("int64"), std::string::npos);

  compiler::OpQuery floor_div{"aten.div.Tensor", {{DType::kFloat32, {4}, false}, {DType::kFloat32, {4}, false}},
                              {{"rounding_mode", std::string("floor")}}, {{DType::kFloat32, {4}, false}}};
  EXPECT_TRUE(compiler::check_support(floor_div).has_value());
}

TEST(CompilerErrors, NamesTheProblem) {
  std::mt19937 rng(1);
  ir::Graph g = testing::make_mlp_graph(2, 8, 8, 2, rng);
  compiler::CompileOptions bad_sm;
  bad_sm.target_sms = {60};
  try {
    compiler::compile_to_desc(g, bad_sm);
    FAIL() << "sm_60 accepted";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("60"), std::string::npos);
  }

  ir::Graph h;
  int x = h.add_input("x", DType::kFloat32, {4});
  int n = h.add_node("aten.flip.default", "my_flip", {x}, {{"dims", std::vector<int64_t>{0}}}, {{DType::kFloat32, {4}}});
  h.set_outputs({h.nodes()[n].outputs[0]});
  try {
    compiler::compile_to_desc(h, {});
    FAIL() << "flip accepted";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("my_flip"), std::string::npos) << e.what();
  }

  ir::Graph c;
  EXPECT_THROW(c.add_constant("w", DType::kFloat32, {2, 2}, std::vector<uint8_t>(3)), CompileError);
}

}  // namespace
}  // namespace kiln
