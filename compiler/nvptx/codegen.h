// The GPU backend's entry point: tile IR -> layouts -> shared-memory plan -> LLVM IR -> O3 -> PTX.
// No LLVM header here: the rest of linac (and user code) compiles without them.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"
#include "compiler/nvptx/stage_override.h"
#include "compiler/passes/smem_plan.h"

namespace linac::nvptx {

/// What to compile for. `sm` 80 emits sm_80 PTX; 90 emits sm_90a (arch-specific features allowed):
/// there the dots that can run on warpgroup tensor cores do, as `sm90_dots` says (passes::DotUnit;
/// A from registers by default: faster than from shared memory with the dots waited for at once,
/// docs/hopper.md).
struct GpuTarget {
  int sm = 90;
  passes::DotUnit sm90_dots = passes::DotUnit::wgmma;
  bool sm90_tma = true;  // pipelined loads through TMA on sm_90a (passes::tma_for_sm)
  /// wgmma products waited for at their result's first use (passes::first_use_wgmma_waits), not at once
  bool sm90_first_use_waits = true;
  bool tma() const { return sm >= 90 && sm90_tma; }
  passes::DotUnit dots() const { return sm >= 90 ? sm90_dots : passes::DotUnit::mma_sync; }
  bool uses_wgmma() const { return dots() != passes::DotUnit::mma_sync; }
  /// name() and, when they are not the defaults, where the dots run and whether loads use TMA: what a
  /// cache key must tell apart.
  std::string key() const;
  /// The target for compute capability `sm` (sm_90a from 90 on, else sm_80), its sm_90a dots as
  /// LINAC_WGMMA asks: 0 mma.sync, 1 wgmma (the default), a-shared wgmma with A from shared memory (to
  /// compare them in one run); its loads through TMA unless LINAC_TMA=0; its products waited for at
  /// their first use unless LINAC_WGMMA_WAIT=at-once (first-use: the default); UserError for other values.
  static GpuTarget for_sm(int sm);
  std::string name() const;  // "sm_80", "sm_90a"
  /// The most dynamic shared memory one block may have there (227 KB on sm_90, 163 KB on sm_80).
  int64_t max_smem_bytes() const { return sm >= 90 ? 232448 : sm == 80 ? 166912 : 101376; }
};

/// How one IR parameter appears in the kernel's ABI: a tensor is its pointer followed by rank i32
/// sizes and rank i64 strides; a scalar is itself.
struct KernelParamInfo {
  std::string name;
  bool is_tensor = false;
  DType dtype = DType::f32;
  int rank = 0;
};

/// A tensor map the kernel takes for its TMA loads (passes::TensorMapSpec). After the IR parameters the
/// ABI has one i32 per map (1: the launcher encoded the map, which the kernel may then use; 0: it
/// could not, and the kernel copies those tiles with plain loads), then the maps themselves, in order,
/// each 128 bytes by value (CUtensorMap, 64-byte aligned).
struct TensorMapParamInfo {
  int param = 0;              // the tensor's index in CompiledKernel::params
  std::vector<int64_t> box;   // elements per tensor dim, outermost first
  int swizzle_bytes = 0;      // 32, 64 or 128
};

/// Every stage of one compiled kernel (each printable, each dumpable).
struct CompiledKernel {
  std::string entry;           // PTX entry name
  std::string tir;             // tile IR as recorded
  std::string tir_layouts;     // tile IR annotated with the layout pass's result
  std::string smem_plan;       // the shared-memory plan
  std::string llvm_ir;         // before optimization
  std::string llvm_ir_opt;     // after O3
  std::string ptx;
  std::vector<KernelParamInfo> params;
  std::vector<TensorMapParamInfo> tensor_maps;
  int num_threads = 128;
  int64_t smem_bytes = 0;      // dynamic shared memory per program
  /// The PTX reallocates registers between warp roles (setmaxnreg: producer warps), which the driver's
  /// linker ignores: the runtime has the driver's JIT compile it whole (cuda::jit_ptx).
  bool reallocates_registers = false;
};

/// The stages of compile_kernel, in order: it can stop after any (`linac compile --emit smem` needs no LLVM).
enum class Stage { layouts, smem, llvm, llvm_opt, ptx };

/// Compiles `k` for `target` up to `last` (the later stages' fields stay empty). UserError for
/// programs the backend cannot lower (with the DSL line). With `replaced`, that stage's output is the
/// override's text and the later stages start from it (the earlier ones are compiled as usual: the
/// launch needs the lowering's parameter list); an override that does not parse or verify is a
/// UserError naming its file.
CompiledKernel compile_kernel(const ir::Kernel& k, const GpuTarget& target,
                              const std::optional<StageOverride>& replaced = std::nullopt, Stage last = Stage::ptx);

/// The LLVM version linked into linac ("22.1.8").
std::string llvm_version();

}  // namespace linac::nvptx
