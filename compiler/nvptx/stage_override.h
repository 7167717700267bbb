// Stage overrides, as Triton's kernel override: a file that replaces one stage's output of one kernel
// (a hand-edited PTX, an experiment on the optimized LLVM IR); the backend starts the later stages from it.
//
// LINAC_OVERRIDE_DIR=D (read here and nowhere else) names a directory laid out as `linac dump` and
// LINAC_DUMP write theirs, so a dump directory is an override directory as it stands: one subdirectory
// per kernel, named <kernel>, <n>-<kernel> (linac dump) or <kernel>-<key> (LINAC_DUMP), holding any of
//   4-lowered.ll    LLVM IR before optimization: O3 and the PTX emitter run on it
//   5-optimized.ll  LLVM IR after O3: the PTX emitter runs on it
//   6-kernel.ptx    the PTX: linked as it is
// When a subdirectory holds several, the latest stage wins (it replaces the ones before it anyway), so
// to start from an edited 5-optimized.ll in a dump directory, delete its 6-kernel.ptx. An op has several
// kernels of one name (one per configuration or variant): a subdirectory with a 1-recorded.tir serves
// only the kernel whose tile IR is exactly that text; without one, the name alone decides.
#pragma once
#include <optional>
#include <string>

#include "compiler/ir/ir.h"

namespace linac::nvptx {

/// The stage files of a dump directory: `linac dump` and LINAC_DUMP write them, overrides read them.
inline constexpr const char* kRecordedTirFile = "1-recorded.tir";
inline constexpr const char* kLayoutsTirFile = "2-layouts.tir";
inline constexpr const char* kSmemPlanFile = "3-smem-plan.txt";
inline constexpr const char* kLoweredLlFile = "4-lowered.ll";
inline constexpr const char* kOptimizedLlFile = "5-optimized.ll";
inline constexpr const char* kPtxFile = "6-kernel.ptx";

/// The stages an override may replace, in pipeline order.
enum class OverrideStage { llvm, llvm_opt, ptx };

/// One stage's output, read from a file of the override directory.
struct StageOverride {
  OverrideStage stage = OverrideStage::ptx;
  std::string path;  // the file it came from, for messages
  std::string text;
  /// "llvm", "llvm-opt" or "ptx": the stage's name in `linac compile --emit`.
  const char* stage_name() const;
};

/// The override for `k` under $LINAC_OVERRIDE_DIR; nullopt when the variable is unset or nothing in the
/// directory is for `k`. Looked up once per kernel (tile IR) and directory per process, thread-safe; the
/// first lookup that finds one prints "linac: kernel K: STAGE replaced by PATH" on stderr. UserError when
/// the directory or a file cannot be read, or when two subdirectories claim `k`.
std::optional<StageOverride> stage_override_from_env(const ir::Kernel& k);

/// The override for the kernel named `kernel_name` with tile IR text `tir` in `dir`, read afresh and
/// silently: what stage_override_from_env() does for each kernel.
std::optional<StageOverride> find_stage_override(const std::string& dir, const std::string& kernel_name,
                                                 const std::string& tir);

}  // namespace linac::nvptx
