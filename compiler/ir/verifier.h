// The tile IR verifier: the single home of the IR's typing rules.
//
// The DSL calls verify_op() on each op right after creating it, so a user's mistake is reported at the
// user's line; passes and the parser call verify() / find_error() on whole kernels. Messages name the
// op (as the DSL spells it for the DSL's checks, "`*`", "where"; by its IR name for the others) and say
// what is wrong in IR types, e.g.
//   "dot: inner dimensions differ: a is tile<64x32xbf16>, b is tile<64x64xbf16>".
// Operand, result and loop-carried indices in messages count from 0.
#pragma once
#include <optional>
#include <string>

#include "compiler/ir/ir.h"

namespace linac::ir {

/// How messages name ops: by their IR names ("mul: ...", for .tir files and passes) or as the DSL
/// spells them ("`*`: ...", "where: ...", for kernels the DSL records; ir::dsl_spelling).
enum class Spelling : uint8_t { ir, dsl };

/// Checks one op's typing rules (operand/result counts and types, attributes, regions). For and If
/// are checked as complete ops, so call it on them once their regions are built and end in a yield;
/// a yield is checked against the for/if that owns its block. Does not check that operands are
/// defined before use (verify() does). Throws UserError(op.loc, "<op>: <what is wrong>").
void verify_op(const Op& op, Spelling spelling = Spelling::ir);

/// Checks a whole kernel: the header (name, parameters, num_warps, num_stages), every op, SSA
/// dominance (each operand is defined earlier in its block or an enclosing one) and terminators (for
/// and if bodies end in exactly one yield; the kernel body has none). Throws UserError at the first
/// problem in program order, located at the op (or, for the header, at the kernel).
void verify(const Kernel& k, Spelling spelling = Spelling::ir);

/// A verifier finding without a location: the op it concerns (null for the kernel header) and the
/// message verify() would throw.
struct Diagnostic {
  const Op* op = nullptr;
  std::string message;
};

/// The first problem verify() would report, or nothing. For tools that locate errors themselves: the
/// parser reports it at the op's position in the .tir text instead of the op's DSL location.
std::optional<Diagnostic> find_error(const Kernel& k);

/// The largest number of elements a tile may have. Far above any real tile (those live in registers
/// or shared memory); the bound keeps element counts from overflowing and stops a malformed kernel
/// from making the interpreter allocate without limit.
inline constexpr int64_t kMaxTileElements = int64_t{1} << 24;

}  // namespace linac::ir
