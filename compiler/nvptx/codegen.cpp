#include "compiler/nvptx/codegen.h"

#include <fmt/format.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>
#include <llvm/TargetParser/Triple.h>

#include <mutex>

#include "compiler/ir/printer.h"
#include "compiler/nvptx/lowering.h"
#include "compiler/passes/layout.h"
#include "compiler/passes/smem_plan.h"

namespace linac::nvptx {

std::string GpuTarget::name() const { return sm >= 90 ? fmt::format("sm_{}a", sm) : fmt::format("sm_{}", sm); }

std::string llvm_version() { return LLVM_VERSION_STRING; }

namespace {

void init_nvptx() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
    // 32-bit pointers for shared memory: halves the registers that shared-memory addresses take.
    const char* argv[] = {"linac", "-nvptx-short-ptr"};
    llvm::cl::ParseCommandLineOptions(2, argv, "linac\n");
  });
}

std::string to_string(const llvm::Module& m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  m.print(os, nullptr);
  return s;
}

}  // namespace

CompiledKernel compile_kernel(const ir::Kernel& k, const GpuTarget& target) {
  init_nvptx();
  CompiledKernel out;
  out.entry = k.name;
  out.tir = ir::print(k);
  out.num_threads = k.num_warps * 32;
  passes::LayoutMap layouts = passes::assign_layouts(k);
  out.tir_layouts = passes::print_with_layouts(k, layouts);
  passes::SmemPlan plan = passes::plan_shared_memory(k, layouts, passes::plan_pipelining(k));
  out.smem_plan = passes::print_smem_plan(k, plan);
  out.smem_bytes = plan.total_bytes;

  llvm::LLVMContext ctx;
  llvm::Module m(k.name, ctx);
  llvm::Triple triple("nvptx64-nvidia-cuda");
  m.setTargetTriple(triple);
  m.addModuleFlag(llvm::Module::Warning, "Debug Info Version", llvm::DEBUG_METADATA_VERSION);
  KernelLowering(k, layouts, plan, m, &out.params).run();
  out.llvm_ir = to_string(m);
  std::string err;
  llvm::raw_string_ostream es(err);
  if (llvm::verifyModule(m, &es))
    throw InternalError(fmt::format("the lowering of {} produced invalid LLVM IR: {}", k.name, err));

  const llvm::Target* t = llvm::TargetRegistry::lookupTarget(triple, err);
  if (!t) throw InternalError("NVPTX target missing from this LLVM: " + err);
  llvm::TargetOptions opts;
  // PTX 8.6 is what LLVM 22 emits for sm_90a; the CUDA 13 driver JIT accepts it for sm_80 too.
  std::unique_ptr<llvm::TargetMachine> tm(
      t->createTargetMachine(triple, target.name(), "+ptx86", opts, std::nullopt, std::nullopt,
                             llvm::CodeGenOptLevel::Aggressive));
  m.setDataLayout(tm->createDataLayout());

  {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PassBuilder pb(tm.get());
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
    mpm.run(m, mam);
  }
  out.llvm_ir_opt = to_string(m);

  llvm::SmallString<0> ptx;
  llvm::raw_svector_ostream ps(ptx);
  llvm::legacy::PassManager cg;
  if (tm->addPassesToEmitFile(cg, ps, nullptr, llvm::CodeGenFileType::AssemblyFile))
    throw InternalError("NVPTX cannot emit assembly");
  cg.run(m);
  out.ptx = std::string(ptx.str());
  // NVPTX still emits an empty .debug_macinfo section with debug directives only; any debug section
  // makes the driver's JIT treat the module as -g, which it refuses for optimized code.
  for (size_t pos; (pos = out.ptx.find("\t.section\t.debug_macinfo")) != std::string::npos;) {
    size_t end = out.ptx.find('\n', pos);
    out.ptx.erase(pos, end == std::string::npos ? std::string::npos : end - pos + 1);
  }
  return out;
}

}  // namespace linac::nvptx
