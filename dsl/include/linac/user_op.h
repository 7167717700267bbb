// A researcher's own op: DSL kernels (linac/dsl.h) with a plan that says which kernels run on which
// tensors. Registered, it runs through every door the library's ops have: ops::run and ops::Call on
// caller-owned tensors (CPU interpreter or GPU), the C ABI, the CLI (`linac list`), and Python, where
// `linac.load("my_op.cpp")` compiles such a file and returns its ops as functions of torch tensors.
//
//   #include "linac/user_op.h"
//   using namespace linac::dsl;
//   std::shared_ptr<linac::ir::Kernel> build(int chunk, linac::DType dt) { ... }   // DSL, as in dsl.h
//   LINAC_USER_OP(retnet) {
//     linac::ops::UserOp op;
//     op.inputs = {"q", "k", "v"};
//     op.outputs = {"o"};
//     op.tuning = {{"chunk", {64, 32, 16}}};                // the first value is the default
//     op.plan = [](const linac::ops::UserCall& c) {
//       const auto& q = c.inputs.at("q");                 // dtype and shape [B, T, H, K]
//       linac::ops::UserPlan p;
//       p.outputs["o"] = {q.dtype, c.inputs.at("v").shape};
//       p.launches.push_back({build(c.config.at("chunk"), q.dtype), {1, q.shape[0] * q.shape[2], 1}});
//       return p;                                          // kernel parameters bind to tensors by name
//     };
//     return op;
//   }
//
// The plan runs once per call key (op, dtypes, shapes, tuning parameters), never per call: the kernels
// it returns are compiled once and cached like the library's. Kernel parameters bind by name to the
// op's inputs, outputs and scratch tensors (UserLaunch::tensors renames), scalars by UserLaunch::scalars.
// Inputs are passed to the kernels as given (their dtypes are the call's: build the kernels for them).
// Scratch tensors start with unspecified contents. A backward is another op (UserOp::backward names it)
// whose inputs are the forward's inputs plus "d" + each output, and whose outputs are "d" + the inputs
// it differentiates; Python's autograd calls it.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "linac/dtype.h"
#include "linac/error.h"

namespace linac::ir {
struct Kernel;
}

namespace linac::ops {

/// The dtype and shape of a tensor of a user op's call.
struct UserTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
};

/// One kernel launch of a plan.
struct UserLaunch {
  std::shared_ptr<ir::Kernel> kernel;
  std::array<int64_t, 3> grid = {1, 1, 1};
  /// Kernel parameter -> tensor of the call (input, output or scratch) where the names differ; a
  /// parameter not named here binds to the tensor of its own name.
  std::map<std::string, std::string> tensors = {};
  /// Scalar parameters (f32, f64, i32 or i64 in the kernel) -> value.
  std::map<std::string, double> scalars = {};
};

/// What a call of the op does: its outputs' dtypes and shapes, the scratch tensors its kernels share,
/// and the launches in order.
struct UserPlan {
  std::map<std::string, UserTensor> outputs;
  std::map<std::string, UserTensor> scratch;
  std::vector<UserLaunch> launches;
};

/// What the plan is asked for: the inputs given (dtypes, shapes) and a value for every tuning parameter
/// (the caller's, the tuner's, or the default: the first candidate).
struct UserCall {
  std::map<std::string, UserTensor> inputs;
  std::map<std::string, int64_t> config;
};

struct UserOp {
  std::string name;     // set by LINAC_USER_OP; letters, digits and '_'
  std::string summary;  // one line for `linac list` and describe()
  std::vector<std::string> inputs;           // required inputs
  std::vector<std::string> optional_inputs;  // inputs a call may leave out
  std::vector<std::string> outputs;          // every output the plan may produce
  /// Tuning parameters and their candidate values, the default first. On the GPU the first call at a
  /// shape times every combination and keeps the fastest (unless LINAC_AUTOTUNE=0), when the op's
  /// inputs are q, k [B, T, H, K] and v [B, T, H, V] (the shapes the tuner knows how to make).
  std::vector<std::pair<std::string, std::vector<int64_t>>> tuning;
  std::function<UserPlan(const UserCall&)> plan;
  std::string backward;  // the name of the op computing this one's gradients, if any
};

/// Adds `op` to the ops every door runs. Registering a name again replaces the op for new calls (a
/// library reloaded after an edit); calls prepared earlier keep the old one. UserError when the name is
/// one of linac's own ops, the description is incomplete, or a tensor name repeats. Thread-safe; ops
/// live until the process exits.
void register_op(UserOp op);

}  // namespace linac::ops

namespace linac::ops::detail {
/// LINAC_USER_OP's registration while a library loads: never throws (an exception there would end the
/// process); a failure is kept for the loader to report (the C ABI's linac_take_load_errors()).
void register_at_load(const char* name, UserOp (*define)()) noexcept;
}  // namespace linac::ops::detail

/// Defines and registers an op named `name` when the file's library is loaded: the body returns the
/// UserOp (its name is filled in).
#define LINAC_USER_OP(name)                                                                       \
  static ::linac::ops::UserOp linac_user_op_##name();                                             \
  namespace {                                                                                     \
  [[maybe_unused]] const bool linac_user_op_registered_##name =                                   \
      (::linac::ops::detail::register_at_load(#name, &linac_user_op_##name), true);               \
  }                                                                                               \
  static ::linac::ops::UserOp linac_user_op_##name()
