#include "kernels/op.h"

#include <fmt/format.h>

#include "kernels/linear_attn.h"
#include "linac/error.h"

namespace linac {

const std::vector<OpDef>& op_registry() {
  static const std::vector<OpDef> ops = {linear_attn_op()};
  return ops;
}

const OpDef& find_op(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& op : op_registry()) {
    if (op.name == name) return op;
    names.push_back(op.name);
  }
  throw UserError(fmt::format("unknown op '{}' (known ops: {})", name, fmt::join(names, ", ")));
}

}  // namespace linac
