#include "compiler_test_util.h"

#include <cstring>

namespace kiln::testing {

int out0(const ir::Graph& g, int node) { return g.nodes()[static_cast<size_t>(node)].outputs[0]; }

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

int slice_last(ir::Graph& g, int x, int64_t start, int64_t end) {
  std::vector<int64_t> s = g.value(x).shape;
  s.back() = end - start;
  return out0(g, g.add_node("aten.slice_copy.Tensor", "slice", {x},
                            {{"dim", static_cast<int64_t>(s.size() - 1)}, {"start", start}, {"end", end}},
                            {{g.value(x).dtype, s}}));
}

std::vector<uint8_t> random_float_bytes(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint8_t> bytes(count * sizeof(float));
  for (size_t i = 0; i < count; ++i) {
    float f = dist(rng);
    std::memcpy(&bytes[i * sizeof(float)], &f, sizeof(float));
  }
  return bytes;
}

ir::Graph make_mlp_graph(int64_t batch, int64_t in, int64_t hidden, int64_t out, std::mt19937& rng) {
  using engine::DType;
  ir::Graph g;
  int x = g.add_input("x", DType::kFloat32, {batch, in});
  auto linear = [&](int input, int64_t k, int64_t n, const std::string& name) {
    int w = g.add_constant(name + "_weight", DType::kFloat32, {n, k}, random_float_bytes(static_cast<size_t>(n * k), rng));
    int b = g.add_constant(name + "_bias", DType::kFloat32, {n}, random_float_bytes(static_cast<size_t>(n), rng));
    int t = g.add_node("aten.permute_copy.default", name + "_t", {w}, {{"dims", std::vector<int64_t>{1, 0}}},
                       {{DType::kFloat32, {k, n}}});
    int wt = g.nodes()[static_cast<size_t>(t)].outputs[0];
    int mm = g.add_node("aten.addmm.default", name, {b, input, wt}, {}, {{DType::kFloat32, {batch, n}}});
    return g.nodes()[static_cast<size_t>(mm)].outputs[0];
  };
  int h1 = linear(x, in, hidden, "fc1");
  int gelu = g.add_node("aten.gelu.default", "gelu", {h1}, {{"approximate", std::string("none")}},
                        {{DType::kFloat32, {batch, hidden}}});
  int h2 = linear(g.nodes()[static_cast<size_t>(gelu)].outputs[0], hidden, hidden, "fc2");
  int relu = g.add_node("aten.relu.default", "relu", {h2}, {}, {{DType::kFloat32, {batch, hidden}}});
  int y = linear(g.nodes()[static_cast<size_t>(relu)].outputs[0], hidden, out, "fc3");
  g.set_outputs({y});
  return g;
}

size_t count_kind(const engine::EngineDesc& d, engine::StepKind kind) {
  size_t n = 0;
  for (const auto& s : d.steps) n += s.kind == kind;
  return n;
}

size_t count_label(const engine::EngineDesc& d, const std::string& label) {
  size_t n = 0;
  for (const auto& s : d.steps) n += s.label == label;
  return n;
}

}  // namespace kiln::testing
