// Users' ops (linac/user_op.h) as ops of the library: a UserOp becomes an OpDef whose prepare() asks the
// user's plan for kernels and binds their parameters to the call's tensors, so that every door (op calls,
// the C ABI, Python, the tuner) runs it without knowing where it came from.
#include "linac/user_op.h"

#include <algorithm>
#include <fmt/format.h>
#include <mutex>
#include <set>

#include "compiler/ir/ir.h"
#include "kernels/common/op_support.h"
#include "kernels/op.h"
#include "runtime/user_ops.h"

namespace linac {

namespace {

bool valid_name(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

void check_user_op(const ops::UserOp& op) {
  if (!valid_name(op.name))
    throw UserError(fmt::format("a user op's name must be letters, digits and '_'; got '{}'", op.name));
  if (op.inputs.empty()) throw UserError(fmt::format("user op {} has no inputs", op.name));
  if (op.outputs.empty()) throw UserError(fmt::format("user op {} has no outputs", op.name));
  if (!op.plan) throw UserError(fmt::format("user op {} has no plan", op.name));
  std::set<std::string> seen;
  for (const auto* names : {&op.inputs, &op.optional_inputs, &op.outputs})
    for (const auto& n : *names) {
      if (!valid_name(n)) throw UserError(fmt::format("user op {}: '{}' is not a tensor name", op.name, n));
      if (!seen.insert(n).second) throw UserError(fmt::format("user op {}: '{}' is named twice", op.name, n));
    }
  std::set<std::string> keys;
  for (const auto& [key, values] : op.tuning) {
    if (!valid_name(key)) throw UserError(fmt::format("user op {}: '{}' is not a tuning parameter name", op.name, key));
    if (!keys.insert(key).second) throw UserError(fmt::format("user op {}: tuning parameter '{}' twice", op.name, key));
    if (values.empty()) throw UserError(fmt::format("user op {}: tuning parameter '{}' has no values", op.name, key));
  }
  if (!op.backward.empty() && !valid_name(op.backward))
    throw UserError(fmt::format("user op {}: '{}' is not an op name", op.name, op.backward));
}

/// The tuning parameters of a call: the defaults (first candidates), overridden by the caller's.
std::map<std::string, int64_t> call_config(const ops::UserOp& op, const OpOptions& opts) {
  std::map<std::string, int64_t> config;
  for (const auto& [key, values] : op.tuning) config[key] = values.front();
  for (const auto& [key, value] : opts.config) {
    if (!config.count(key)) {
      std::vector<std::string> known;
      for (const auto& [k, v] : op.tuning) known.push_back(k);
      throw UserError(fmt::format("{} has no tuning parameter '{}' (it has: {})", op.name, key,
                                  known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", "))));
    }
    config[key] = value;
  }
  if (opts.chunk_size) {
    if (!config.count("chunk")) throw UserError(fmt::format("{} has no tuning parameter 'chunk'", op.name));
    config["chunk"] = *opts.chunk_size;
  }
  return config;
}

OpPlan plan_user_op(const ops::UserOp& op, const TensorMap& inputs, const OpOptions& opts,
                    const std::vector<std::string>& wanted) {
  if (opts.recurrent || opts.backward || opts.normalize || opts.no_normalize || opts.l2norm_qk || opts.a || opts.b ||
      opts.c || opts.noise_dropout || opts.scale)
    throw UserError(fmt::format("{} is a user op: it takes tuning parameters only (its gradients are op '{}')",
                                op.name, op.backward.empty() ? "none" : op.backward));
  ops::UserCall call;
  for (const auto& name : op.inputs)
    if (!inputs.count(name)) throw UserError(fmt::format("{}: missing input '{}'", op.name, name));
  for (const auto& [name, t] : inputs) call.inputs[name] = {t.dtype, t.shape};
  call.config = call_config(op, opts);

  ops::UserPlan p;
  try {
    p = op.plan(call);
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    throw UserError(fmt::format("the plan of user op {} failed: {}", op.name, e.what()));
  }

  OpPlan plan;
  auto add = [&](const std::string& name, const ops::UserTensor& t, const char* what) {
    for (int64_t d : t.shape)
      if (d < 0) throw UserError(fmt::format("{}: {} '{}' has a negative dimension", op.name, what, name));
    if (!plan.tensors.emplace(name, HostTensor::zeros(t.dtype, t.shape)).second)
      throw UserError(fmt::format("{}: the plan's {} '{}' has the name of another tensor of the call", op.name, what, name));
  };
  for (const auto& [name, t] : inputs) plan.tensors[name] = t;
  for (const auto& name : wanted)
    if (!p.outputs.count(name)) throw UserError(fmt::format("{}: the plan gives no output '{}'", op.name, name));
  for (const auto& [name, t] : p.outputs) {
    if (std::find(op.outputs.begin(), op.outputs.end(), name) == op.outputs.end())
      throw UserError(fmt::format("{}: the plan gives output '{}', which the op does not declare", op.name, name));
    add(name, t, "output");
    if (std::find(wanted.begin(), wanted.end(), name) != wanted.end()) plan.outputs[name] = name;
  }
  for (const auto& [name, t] : p.scratch) add(name, t, "scratch tensor");

  for (const auto& l : p.launches) {
    if (!l.kernel) throw UserError(fmt::format("{}: a launch of the plan has no kernel", op.name));
    KernelLaunch kl;
    kl.kernel = l.kernel;
    kl.grid = l.grid;
    for (int64_t g : l.grid)
      if (g < 0) throw UserError(fmt::format("{}: kernel {} has a negative grid size", op.name, l.kernel->name));
    for (const auto& param : l.kernel->params) {
      if (param.value->type.is_tensor()) {
        auto renamed = l.tensors.find(param.name);
        const std::string tensor = renamed == l.tensors.end() ? param.name : renamed->second;
        if (!plan.tensors.count(tensor))
          throw UserError(fmt::format("{}: parameter '{}' of kernel {} binds to '{}', which is no input, output or "
                                      "scratch tensor of the call",
                                      op.name, param.name, l.kernel->name, tensor));
        kl.tensors[param.name] = tensor;
      } else {
        auto s = l.scalars.find(param.name);
        if (s == l.scalars.end())
          throw UserError(fmt::format("{}: scalar parameter '{}' of kernel {} has no value (UserLaunch::scalars)", op.name,
                                      param.name, l.kernel->name));
        kl.scalars[param.name] = s->second;
      }
    }
    plan.launches.push_back(std::move(kl));
  }
  return plan;
}

/// The tuner's inputs for ops of q, k, v: uniform in [-1, 1), fixed seed (as the library's ops make them).
TensorMap random_qkv(const ProblemShape& s, uint64_t seed) {
  return {{"q", random_uniform({s.B, s.T, s.H, s.K}, seed)},
          {"k", random_uniform({s.B, s.T, s.H, s.K}, seed + 1)},
          {"v", random_uniform({s.B, s.T, s.H, s.V}, seed + 2)}};
}

/// Every combination of the candidates, the defaults first (at most 64).
std::vector<Config> tuning_space(const ops::UserOp& op) {
  std::vector<Config> space = {Config{}};
  for (const auto& [key, values] : op.tuning) {
    std::vector<Config> next;
    for (const auto& c : space)
      for (int64_t v : values) {
        Config d = c;
        d[key] = v;
        next.push_back(std::move(d));
      }
    space = std::move(next);
    if (space.size() > 64) space.resize(64);
  }
  return space;
}

OpDef to_op_def(const ops::UserOp& user) {
  auto op = std::make_shared<const ops::UserOp>(user);
  OpDef d;
  d.name = op->name;
  d.summary = op->summary.empty() ? "a user op (linac/user_op.h)" : op->summary;
  for (const auto& n : op->inputs) d.inputs.push_back({n, true, "", ""});
  for (const auto& n : op->optional_inputs) d.inputs.push_back({n, false, "", ""});
  for (const auto& n : op->outputs) d.outputs.push_back({n, true, "", ""});
  for (const auto& [key, values] : op->tuning)
    d.config_keys.emplace_back(key, fmt::format("candidates {} (default {})", fmt::join(values, ", "), values.front()));
  d.gradient_op = op->backward;
  d.prepare = [op](const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted) {
    return plan_user_op(*op, inputs, opts, wanted);
  };
  auto has = [&](const char* name) { return std::find(op->inputs.begin(), op->inputs.end(), name) != op->inputs.end(); };
  if (!op->tuning.empty() && op->inputs.size() == 3 && has("q") && has("k") && has("v")) {
    d.random_inputs = random_qkv;
    d.shape_of = [](const TensorMap& in) {
      const auto& q = in.at("q").shape;
      const auto& v = in.at("v").shape;
      if (q.size() != 4 || v.size() != 4) return ProblemShape{};
      return ProblemShape{q[0], q[1], q[2], q[3], v[3], false};
    };
    d.tuning_space = [op](const ProblemShape&, const OpOptions&) { return tuning_space(*op); };
  }
  return d;
}

std::mutex& load_report_mutex() {
  static std::mutex mu;
  return mu;
}

UserOpLoadReport& load_report() {
  static UserOpLoadReport report;
  return report;
}

}  // namespace

UserOpLoadReport take_user_op_load_report() {
  std::lock_guard lock(load_report_mutex());
  UserOpLoadReport out;
  std::swap(out, load_report());
  return out;
}

namespace ops {

void register_op(UserOp op) {
  check_user_op(op);
  add_op(to_op_def(op));
}

namespace detail {

void register_at_load(const char* name, UserOp (*define)()) noexcept {
  std::string error;
  try {
    UserOp op = define();
    op.name = name;
    register_op(std::move(op));
    std::lock_guard lock(load_report_mutex());
    load_report().ops.push_back(name);
    return;
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "unknown exception";
  }
  try {
    std::lock_guard lock(load_report_mutex());
    std::string& errors = load_report().errors;
    errors += fmt::format("{}user op {}: {}", errors.empty() ? "" : "\n", name, error);
  } catch (...) {
    // Out of memory while recording an error at load time: nothing better to do.
  }
}

}  // namespace detail

}  // namespace ops

}  // namespace linac
