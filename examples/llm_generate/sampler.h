// Picks the next token from a row of logits on the host: greedy (temperature 0, the first largest
// logit, as torch.argmax) or sampled from softmax(logits / temperature) restricted as Hugging
// Face's generate restricts it: the top_k largest logits, then the smallest set of those whose
// probabilities add up to top_p. Seeded, so a generation repeats.
#pragma once

#include <cstddef>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace llm {

struct SamplerOptions {
  double temperature = 0.0;  // 0: greedy; else > 0
  int64_t top_k = 0;         // 0: every token
  double top_p = 1.0;        // in (0, 1]; 1: no cut
  uint64_t seed = 0;
};

// Why `o` cannot sample ("" when it can), naming the flag.
std::string sampler_options_invalid(const SamplerOptions& o);

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o) : options_(o), rng_(o.seed) {}

  bool greedy() const { return options_.temperature == 0.0; }

  // The token for `logits[0..n)`, or -1 with *why set when the row cannot be sampled (empty, or a
  // NaN logit).
  int64_t pick(const float* logits, size_t n, std::string* why);

  // The probabilities the last sampled pick drew from, for tests: (token, probability) pairs
  // summing to 1, largest first when top_k or top_p cut them, else in token order.
  std::vector<std::pair<int64_t, double>> last_distribution() const;

 private:
  // A logit's unnormalized probability: exp((logit - top) / temperature) in float (a double exp
  // of a 32k vocabulary costs about a decode step); with a +inf top, 1 for the top ones, else 0.
  double weight(double logit) const {
    if (std::isinf(top_)) return logit == top_ ? 1.0 : 0.0;
    return std::exp((static_cast<float>(logit) - static_cast<float>(top_)) * inv_t_);
  }

  SamplerOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::pair<int64_t, double>> kept_;  // (token, logit), reused: no allocation per token once grown
  double top_ = 0.0, total_ = 1.0;
  float inv_t_ = 1.0f;
};

}  // namespace llm
