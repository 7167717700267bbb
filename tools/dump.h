// `linac dump`: every stage of an op's kernels written to a directory, plus the PTX annotated with
// the DSL source lines its .loc directives point at, and ptxas's resource report when ptxas is here.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "compiler/nvptx/codegen.h"

namespace linac {

/// The PTX with each run of instructions under the DSL source line (file:line and its text) that its
/// .loc directives name; lines of unknown files print without text.
std::string annotate_ptx(const std::string& ptx);

/// Writes <dir>/<index>-<kernel>/{1-recorded.tir .. 7-annotated.txt[, 8-kernel.cubin, 9-resources.txt]}
/// for each kernel; returns one summary line per kernel.
std::vector<std::string> dump_kernels(const std::vector<std::shared_ptr<ir::Kernel>>& kernels, const std::string& dir,
                                      const nvptx::GpuTarget& target);

}  // namespace linac
