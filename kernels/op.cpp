#include "kernels/op.h"

#include <algorithm>
#include <deque>
#include <fmt/format.h>
#include <mutex>

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

namespace {

/// Ops added at run time. A deque: adding one moves none, so every OpDef& handed out stays valid.
struct AddedOps {
  std::mutex mu;
  std::deque<OpDef> ops;
};

AddedOps& added_ops() {
  static AddedOps* added = new AddedOps;  // never destroyed: prepared calls point into it
  return *added;
}

}  // namespace

std::vector<const OpDef*> all_ops() {
  std::vector<const OpDef*> out;
  for (const auto& op : op_registry()) out.push_back(&op);
  AddedOps& a = added_ops();
  std::lock_guard lock(a.mu);
  for (size_t i = 0; i < a.ops.size(); ++i) {
    // An op added again under its name (a user's library reloaded) shadows the earlier one.
    const bool shadowed = std::any_of(a.ops.begin() + static_cast<std::ptrdiff_t>(i) + 1, a.ops.end(),
                                      [&](const OpDef& later) { return later.name == a.ops[i].name; });
    if (!shadowed) out.push_back(&a.ops[i]);
  }
  return out;
}

void add_op(OpDef op) {
  if (std::any_of(op_registry().begin(), op_registry().end(), [&](const OpDef& o) { return o.name == op.name; }))
    throw UserError(fmt::format("'{}' is the name of one of linac's ops", op.name));
  AddedOps& a = added_ops();
  std::lock_guard lock(a.mu);
  a.ops.push_back(std::move(op));
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
  // Every op call looks its op up: the library's ops first, without a lock or a copy.
  for (const auto& op : op_registry())
    if (op.name == name) return op;
  {
    AddedOps& a = added_ops();
    std::lock_guard lock(a.mu);
    for (auto it = a.ops.rbegin(); it != a.ops.rend(); ++it)  // the newest of a name
      if (it->name == name) return *it;
  }
  std::vector<std::string> names;
  for (const OpDef* op : all_ops()) names.push_back(op->name);
  throw UserError(fmt::format("unknown op '{}' (known ops: {})", name, fmt::join(names, ", ")));
}

}  // namespace linac
