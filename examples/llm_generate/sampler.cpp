#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace llm {

std::string sampler_options_invalid(const SamplerOptions& o) {
  char buf[160];
  if (!(o.temperature >= 0.0) || std::isinf(o.temperature)) {
    std::snprintf(buf, sizeof buf, "--temperature %g (0 for greedy, or a finite positive value)", o.temperature);
    return buf;
  }
  if (o.top_k < 0) {
    std::snprintf(buf, sizeof buf, "--top_k %lld (0 for every token, or a positive count)", static_cast<long long>(o.top_k));
    return buf;
  }
  if (!(o.top_p > 0.0 && o.top_p <= 1.0)) {
    std::snprintf(buf, sizeof buf, "--top_p %g (in (0, 1]; 1 for no cut)", o.top_p);
    return buf;
  }
  if (o.temperature == 0.0 && (o.top_k != 0 || o.top_p != 1.0))
    return "--top_k and --top_p restrict sampling: give a --temperature above 0 with them";
  return "";
}

int64_t Sampler::pick(const float* logits, size_t n, std::string* why) {
  if (n == 0) {
    *why = "the logits row is empty";
    return -1;
  }
  for (size_t i = 0; i < n; ++i)
    if (std::isnan(logits[i])) {
      *why = "logit " + std::to_string(i) + " is NaN";
      return -1;
    }
  if (greedy()) {  // the first largest, as torch.argmax
    size_t best = 0;
    for (size_t i = 1; i < n; ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<int64_t>(best);
  }
  kept_.resize(n);
  for (size_t i = 0; i < n; ++i) kept_[i] = {static_cast<int64_t>(i), logits[i]};
  // Largest first; ties by the lower id, so the order (and the draw) does not depend on the sort.
  auto larger = [](const std::pair<int64_t, double>& a, const std::pair<int64_t, double>& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  bool sorted = false;
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < n) {
    const size_t keep = static_cast<size_t>(options_.top_k);
    std::partial_sort(kept_.begin(), kept_.begin() + static_cast<std::ptrdiff_t>(keep), kept_.end(), larger);
    kept_.resize(keep);
    sorted = true;
  }
  // softmax(logit / temperature) over the kept tokens: the exponentials in float (a double exp
  // of a 32k vocabulary costs about a decode step), the sums in double; -inf logits get 0.
  double top = kept_[0].second;
  for (const auto& kp : kept_) top = std::max(top, kp.second);
  if (std::isinf(top) && top < 0) {
    *why = "every logit is -inf";
    return -1;
  }
  inv_t_ = static_cast<float>(1.0 / options_.temperature);
  top_ = top;
  double total = 0.0;
  for (const auto& kp : kept_) total += weight(kp.second);
  // top_p: the smallest set of the largest logits whose probabilities reach top_p (at least one
  // token). Only the head of the order is needed: sort the 64 largest, then 4x more, until they
  // reach it (a whole sort of a 32k vocabulary would cost more than a decode step).
  if (options_.top_p < 1.0) {
    const double need = options_.top_p * total;
    size_t head = sorted ? kept_.size() : std::min<size_t>(64, kept_.size()), cut = 0;
    for (;;) {
      if (!sorted)
        std::partial_sort(kept_.begin(), kept_.begin() + static_cast<std::ptrdiff_t>(head), kept_.end(), larger);
      double sum = 0.0;
      cut = 0;
      while (cut < head && sum < need) sum += weight(kept_[cut++].second);
      if (sum >= need || head == kept_.size()) break;
      head = std::min(kept_.size(), head * 4);
    }
    kept_.resize(std::max<size_t>(cut, 1));
    total = 0.0;
    for (const auto& kp : kept_) total += weight(kp.second);
  }
  total_ = total;
  // A uniform draw in [0, total) from the top 53 bits, walked along the cumulative weights.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double sum = 0.0;
  int64_t last = kept_[0].first;
  for (const auto& [id, logit] : kept_) {
    const double w = weight(logit);
    if (w <= 0.0) continue;  // a -inf logit is never drawn
    sum += w;
    last = id;
    if (u < sum) return id;
  }
  return last;  // u past the rounded total
}

std::vector<std::pair<int64_t, double>> Sampler::last_distribution() const {
  std::vector<std::pair<int64_t, double>> d(kept_);
  for (auto& kp : d) kp.second = weight(kp.second) / total_;
  return d;
}

}  // namespace llm
