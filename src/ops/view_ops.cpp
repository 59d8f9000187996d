#include "ops/view_ops.h"

namespace kiln::ops {

bool is_view_op(const std::string& op) {
  return op == "aten.view_copy.default" || op == "aten._unsafe_view.default" ||
         op == "aten.view.default" || op == "aten.reshape.default" ||
         op == "aten.squeeze_copy.dims" || op == "aten.squeeze_copy.dim" ||
         op == "aten.squeeze_copy.default" || op == "aten.unsqueeze_copy.default" ||
         op == "aten.alias_copy.default" || op == "aten.flatten.using_ints";
}

bool is_constant_permute_op(const std::string& op) {
  return op == "aten.permute_copy.default" || op == "aten.t_copy.default" ||
         op == "aten.transpose_copy.int" || op == "aten.permute.default" ||
         op == "aten.t.default";
}

}  // namespace kiln::ops
