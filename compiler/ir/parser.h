// Reads the tile IR text format written by print() (the format is described in printer.h).
#pragma once
#include <memory>
#include <string_view>

#include "compiler/ir/ir.h"

namespace linac::ir {

/// Parses one kernel and verifies it. Every problem, syntactic or a verifier finding, is a UserError
/// whose message starts with "<filename>:<line>: error: " (the SourceLoc printing decides whether a
/// column follows) and whose loc() is the {filename, line, col} of the offending token in `text`;
/// a verifier finding is reported at the op's name. Never crashes on malformed input.
std::shared_ptr<Kernel> parse(std::string_view text, std::string_view filename = "<input>");

}  // namespace linac::ir
