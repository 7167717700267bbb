// Errors linac reports. Two kinds, as in Halide: UserError for mistakes the user can fix (bad DSL
// program, bad arguments, no GPU, bad cache dir) and InternalError for bugs in linac itself.
#pragma once
#include <source_location>
#include <stdexcept>
#include <string>

namespace linac {

/// A source position in the user's DSL program (or in a .tir file). line 0 means unknown.
struct SourceLoc {
  std::string file;
  unsigned line = 0;
  unsigned col = 0;

  static SourceLoc from(const std::source_location& l) { return {l.file_name(), l.line(), l.column()}; }
  bool known() const { return line != 0; }
  /// "file:line:col" ("file:line" when the column is unknown) or "<unknown>".
  std::string str() const;
};

/// A mistake the user can act on. For DSL errors the message starts with the DSL file:line.
class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& msg) : std::runtime_error(msg) {}
  UserError(const SourceLoc& loc, const std::string& msg);
  /// The location the error points at (unknown when not a DSL error).
  const SourceLoc& loc() const { return loc_; }

 private:
  SourceLoc loc_;
};

/// A bug in linac: an invariant the compiler itself broke.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& msg) : std::logic_error("linac internal error: " + msg) {}
};

}  // namespace linac

/// Checks an invariant of linac itself; throws InternalError with the C++ location on failure.
#define LINAC_INTERNAL_CHECK(cond, msg)                                                              \
  do {                                                                                              \
    if (!(cond))                                                                                    \
      throw ::linac::InternalError(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " +  \
                                   (msg) + " (" #cond ")");                                         \
  } while (0)
