#include "ops/dim_arg.h"

#include <algorithm>

namespace kiln::ops {

std::string normalize_dim(int64_t dim, size_t rank, const std::string& what, int64_t* normalized,
                          bool scalar_is_rank1) {
  const int64_t r = static_cast<int64_t>(scalar_is_rank1 ? std::max<size_t>(rank, 1) : rank);
  if (dim < -r || dim >= r)
    return what + " dim " + std::to_string(dim) + " is out of range for rank " + std::to_string(rank);
  *normalized = dim < 0 ? dim + r : dim;
  return "";
}

}  // namespace kiln::ops
