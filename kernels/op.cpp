#include "kernels/op.h"

#include <fmt/format.h>

#include "kernels/delta_rule/op.h"
#include "kernels/gla/op.h"
#include "kernels/linear_attn/op.h"
#include "kernels/poly/op.h"
#include "linac/error.h"

namespace linac {

const std::vector<OpDef>& op_registry() {
  static const std::vector<OpDef> ops = {linear_attn_op(), poly_op(), delta_rule_op(), gated_delta_rule_op(), gla_op()};
  return ops;
}

std::string ProblemShape::str() const {
  return fmt::format("B={},T={},H={},K={},V={}{}", B, T, H, K, V, gated ? ",gated" : "");
}

std::string config_str(const Config& c) {
  if (c.empty()) return "default";
  std::string out;
  for (const auto& [k, v] : c) out += fmt::format("{}{}={}", out.empty() ? "" : ",", k, v);
  return out;
}

std::map<std::string, int64_t> parse_config(const std::string& text) {
  std::map<std::string, int64_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UserError(fmt::format("--config: expected key=value, got '{}'", item));
    std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    try {
      size_t used = 0;
      out[key] = std::stoll(val, &used);
      if (used != val.size()) throw std::invalid_argument(val);
    } catch (const std::exception&) {
      throw UserError(fmt::format("--config: {} must be an integer, got '{}'", key, val));
    }
    pos = comma == std::string::npos ? text.size() : comma + 1;
  }
  return out;
}

void check_op_options(const OpDef& op, const OpOptions& opts) {
  auto require = [&](bool set, const char* flag, const char* option) {
    if (!set) return;
    for (const auto& f : op.flags)
      if (f == flag) return;
    throw UserError(fmt::format("{} does not take {}", op.name, option));
  };
  require(opts.recurrent, "recurrent", "--recurrent");
  require(opts.backward, "backward", "--backward");
  require(opts.normalize, "normalize", "--normalize");
  require(opts.no_normalize, "no_normalize", "--no-normalize");
  require(opts.l2norm_qk, "l2norm_qk", "--l2norm-qk");
  require(opts.a || opts.b || opts.c, "coefficients", "--a/--b/--c");
  require(opts.noise_dropout.has_value(), "noise_dropout", "--noise-dropout");
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
