// Users' ops (linac/user_op.h) inside linac: what the loader reports after a library registered them.
#pragma once
#include <string>
#include <vector>

namespace linac {

/// What LINAC_USER_OP registered since the last call: the ops' names, and the failures (one line each,
/// "" when none). Forgets both.
struct UserOpLoadReport {
  std::vector<std::string> ops;
  std::string errors;
};
UserOpLoadReport take_user_op_load_report();

}  // namespace linac
