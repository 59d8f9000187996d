// llm_generate's host sampler (examples/llm_generate/sampler.h) against
// distributions computed here in double from fresh random logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "sampler.h"

namespace {

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// softmax(logits / t) in double.
std::vector<double> softmax(const std::vector<float>& logits, double t) {
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((logits[i] - top) / t);
  for (double& x : p) x /= sum;
  return p;
}

// Ids by probability, largest first (ties: lower id first).
std::vector<int64_t> ranked(const std::vector<double>& p) {
  std::vector<int64_t> ids(p.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
  return ids;
}

TEST(LlmSampler, OptionsAreCheckedByName) {
  llm::SamplerOptions o;
  EXPECT_EQ(llm::sampler_options_invalid(o), "");
  o.temperature = -0.5;
  EXPECT_NE(llm::sampler_options_invalid(o).find("--temperature -0.5"), std::string::npos);
  o.temperature = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(llm::sampler_options_invalid(o).find("--temperature"), std::string::npos);
  o.temperature = std::numeric_limits<double>::infinity();
  EXPECT_NE(llm::sampler_options_invalid(o).find("--temperature"), std::string::npos);
  o.temperature = 0.7;
  o.top_p = 0.0;
  EXPECT_NE(llm::sampler_options_invalid(o).find("--top_p 0"), std::string::npos);
  o.top_p = 1.5;
  EXPECT_NE(llm::sampler_options_invalid(o).find("--top_p 1.5"), std::string::npos);
  o.top_p = 0.9;
  o.top_k = -3;
  EXPECT_NE(llm::sampler_options_invalid(o).find("--top_k -3"), std::string::npos);
  o.top_k = 40;
  EXPECT_EQ(llm::sampler_options_invalid(o), "");
  o.temperature = 0.0;  // greedy with a cut: the cut would be ignored, so it is refused
  EXPECT_NE(llm::sampler_options_invalid(o).find("--temperature"), std::string::npos);
}

TEST(LlmSampler, GreedyIsTheFirstLargestLogit) {
  llm::Sampler s(llm::SamplerOptions{});
  std::string why;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::vector<float> v = random_logits(1000 + seed, seed);
    const auto best = std::max_element(v.begin(), v.end()) - v.begin();
    EXPECT_EQ(s.pick(v.data(), v.size(), &why), best);
  }
  std::vector<float> tie = random_logits(64, 5);
  const float top = *std::max_element(tie.begin(), tie.end());
  tie[40] = tie[17] = top + 1.0f;
  EXPECT_EQ(s.pick(tie.data(), tie.size(), &why), 17) << "torch.argmax takes the first";
}

TEST(LlmSampler, RowsThatCannotBeSampledAreNamed) {
  for (double t : {0.0, 0.8}) {
    llm::SamplerOptions o;
    o.temperature = t;
    llm::Sampler s(o);
    std::string why;
    EXPECT_EQ(s.pick(nullptr, 0, &why), -1);
    EXPECT_NE(why.find("empty"), std::string::npos);
    std::vector<float> v = random_logits(32, 3);
    v[9] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(s.pick(v.data(), v.size(), &why), -1);
    EXPECT_NE(why.find("logit 9 is NaN"), std::string::npos) << why;
  }
  llm::SamplerOptions o;
  o.temperature = 1.0;
  llm::Sampler s(o);
  std::vector<float> v(8, -std::numeric_limits<float>::infinity());
  std::string why;
  EXPECT_EQ(s.pick(v.data(), v.size(), &why), -1);
  EXPECT_NE(why.find("-inf"), std::string::npos);
}

TEST(LlmSampler, TemperatureDistributionIsTheSoftmax) {
  for (double t : {0.3, 1.0, 2.5}) {
    llm::SamplerOptions o;
    o.temperature = t;
    llm::Sampler s(o);
    const std::vector<float> v = random_logits(500, static_cast<uint32_t>(t * 10));
    std::string why;
    const int64_t id = s.pick(v.data(), v.size(), &why);
    ASSERT_GE(id, 0) << why;
    const std::vector<double> want = softmax(v, t);
    const auto& got = s.last_distribution();
    ASSERT_EQ(got.size(), v.size());
    for (const auto& [tok, p] : got)  // the exponentials are float's: 1e-6 relative
      EXPECT_NEAR(p, want[static_cast<size_t>(tok)], 1e-6 * want[static_cast<size_t>(tok)] + 1e-12) << "token " << tok;
  }
}

TEST(LlmSampler, TopKKeepsTheKLargest) {
  llm::SamplerOptions o;
  o.temperature = 0.9;
  o.top_k = 7;
  llm::Sampler s(o);
  const std::vector<float> v = random_logits(300, 11);
  std::string why;
  ASSERT_GE(s.pick(v.data(), v.size(), &why), 0) << why;
  const std::vector<double> full = softmax(v, o.temperature);
  const std::vector<int64_t> order = ranked(full);
  const auto& got = s.last_distribution();
  ASSERT_EQ(got.size(), 7u);
  double kept_mass = 0.0;
  for (size_t i = 0; i < 7; ++i) kept_mass += full[static_cast<size_t>(order[i])];
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(got[i].first, order[i]);
    EXPECT_NEAR(got[i].second, full[static_cast<size_t>(order[i])] / kept_mass, 1e-6 * got[i].second);
  }
}

TEST(LlmSampler, TopPKeepsTheSmallestSetReachingP) {
  // (top_p, vocabulary, logit scale): flat rows of many tokens need more than the first 64 sorted.
  const std::vector<std::tuple<double, size_t, float>> cases = {
      {0.1, 200, 2.0f}, {0.5, 200, 2.0f}, {0.9, 200, 2.0f}, {0.99, 200, 2.0f}, {0.5, 5000, 0.2f}, {0.95, 32000, 0.5f}};
  for (const auto& [p, n, scale] : cases) {
    llm::SamplerOptions o;
    o.temperature = 1.0;
    o.top_p = p;
    llm::Sampler s(o);
    const std::vector<float> v = random_logits(n, static_cast<uint32_t>(p * 100 + n), scale);
    std::string why;
    ASSERT_GE(s.pick(v.data(), v.size(), &why), 0) << why;
    const std::vector<double> full = softmax(v, 1.0);
    const std::vector<int64_t> order = ranked(full);
    const auto& got = s.last_distribution();
    ASSERT_GE(got.size(), 1u);
    double mass = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, order[i]);
      mass += full[static_cast<size_t>(order[i])];
    }
    EXPECT_GE(mass, p - 1e-9) << "the kept tokens reach top_p";
    if (n > 1000) {
      EXPECT_GT(got.size(), 64u) << "a flat row keeps more than the first sorted head";
    }
    EXPECT_LT(mass - full[static_cast<size_t>(order[got.size() - 1])], p + 1e-9) << "and one fewer would not";
  }
}

TEST(LlmSampler, DrawsFollowTheDistributionAndRepeatWithTheSeed) {
  llm::SamplerOptions o;
  o.temperature = 1.0;
  o.seed = 1234;
  const std::vector<float> v = {0.5f, -1.0f, 2.0f, 1.2f, -std::numeric_limits<float>::infinity(), 0.0f};
  const std::vector<double> want = softmax(v, 1.0);
  llm::Sampler s(o), again(o);
  const int n = 40000;
  std::vector<int> count(v.size(), 0);
  std::string why;
  for (int i = 0; i < n; ++i) {
    const int64_t id = s.pick(v.data(), v.size(), &why);
    ASSERT_GE(id, 0) << why;
    ASSERT_EQ(again.pick(v.data(), v.size(), &why), id) << "draw " << i << " with the same seed";
    ++count[static_cast<size_t>(id)];
  }
  EXPECT_EQ(count[4], 0) << "a -inf logit is never drawn";
  for (size_t i = 0; i < v.size(); ++i) {
    const double sigma = std::sqrt(n * want[i] * (1 - want[i]));
    EXPECT_NEAR(count[i], n * want[i], 5 * sigma + 1) << "token " << i;
  }
  llm::Sampler first(o);
  o.seed = 1235;  // another seed: another sequence
  llm::Sampler other(o);
  const std::vector<float> flat = random_logits(1000, 77, 0.1f);
  int same = 0;
  for (int i = 0; i < 50; ++i) same += other.pick(flat.data(), flat.size(), &why) == first.pick(flat.data(), flat.size(), &why);
  EXPECT_LT(same, 10);
}

}  // namespace
