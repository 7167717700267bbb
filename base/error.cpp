#include "linac/error.h"

#include <fmt/format.h>

namespace linac {

std::string SourceLoc::str() const {
  if (!known()) return "<unknown>";
  return col ? fmt::format("{}:{}:{}", file, line, col) : fmt::format("{}:{}", file, line);
}

UserError::UserError(const SourceLoc& loc, const std::string& msg)
    : std::runtime_error(loc.known() ? fmt::format("{}: error: {}", loc.str(), msg) : msg), loc_(loc) {}

}  // namespace linac
