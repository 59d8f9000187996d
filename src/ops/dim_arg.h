// A dim argument (softmax, argmax, cumsum, cat, select, ...) checked against
// its tensor's rank and normalized, one rule for every op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::ops {

// `dim` in [-rank, rank) normalized into [0, rank) in *normalized; with
// `scalar_is_rank1` a 0-d tensor takes dim 0 or -1 (as PyTorch's reductions
// and scans do), normalized to 0. Returns "" or why not, naming `what` (an op
// or a node): "<what> dim <dim> is out of range for rank <rank>".
std::string normalize_dim(int64_t dim, size_t rank, const std::string& what, int64_t* normalized,
                          bool scalar_is_rank1 = true);

}  // namespace kiln::ops
