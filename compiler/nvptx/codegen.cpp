#include <algorithm>
#include "compiler/nvptx/codegen.h"

#include <cstdlib>
#include <fmt/format.h>
#include <llvm/AsmParser/Parser.h>
#include <llvm/IR/AutoUpgrade.h>
#include <llvm/IR/ModuleSummaryIndex.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>
#include <llvm/TargetParser/Triple.h>

#include <mutex>

#include "compiler/ir/printer.h"
#include "compiler/nvptx/lowering.h"
#include "compiler/passes/dot_accumulate.h"
#include "compiler/passes/layout.h"
#include "compiler/passes/smem_plan.h"
#include "compiler/passes/wgmma_waits.h"

namespace linac::nvptx {

GpuTarget GpuTarget::for_sm(int sm) {
  GpuTarget t{sm >= 90 ? 90 : 80};
  t.sm90_dots = passes::dot_unit_for_sm(90);
  t.sm90_tma = passes::tma_for_sm(90);
  if (const char* w = std::getenv("LINAC_WGMMA_WAIT"); w && *w) {
    const std::string s(w);
    if (s != "first-use" && s != "at-once")
      throw UserError(fmt::format("LINAC_WGMMA_WAIT={}: expected first-use or at-once", s));
    t.sm90_first_use_waits = s == "first-use";
  }
  return t;
}

std::string GpuTarget::key() const {
  const std::string loads = std::string(sm >= 90 && !tma() ? "-no-tma" : "") +
                            (uses_wgmma() && !sm90_first_use_waits ? "-waits-at-once" : "");
  switch (dots()) {
    case passes::DotUnit::wgmma: return name() + loads;
    case passes::DotUnit::wgmma_a_shared: return name() + "-wgmma-a-shared" + loads;
    case passes::DotUnit::mma_sync: return sm >= 90 ? name() + "-mma.sync" + loads : name();
  }
  return name();
}

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

/// The override's LLVM IR as a module of `ctx`. It is the user's text, so every defect is a UserError
/// naming the file: it does not parse, does not verify, or lacks the kernel's entry function.
std::unique_ptr<llvm::Module> parse_override(const StageOverride& o, const std::string& entry, llvm::LLVMContext& ctx) {
  // Parsed without the debug-info upgrade, which verifies the module and aborts the process when it is
  // broken (LLVM's report_fatal_error): the verifier runs here first, reporting, and the upgrade after.
  llvm::SMDiagnostic diag;
  auto parsed = llvm::parseAssemblyFileWithIndexNoUpgradeDebugInfo(
      o.path, diag, ctx, nullptr, [](llvm::StringRef, llvm::StringRef) { return std::nullopt; });
  std::unique_ptr<llvm::Module> m = std::move(parsed.Mod);
  if (!m)
    throw UserError(fmt::format("kernel {}: {}:{}:{}: {}", entry, o.path, diag.getLineNo(), diag.getColumnNo() + 1,
                                diag.getMessage().str()));
  std::string err;
  llvm::raw_string_ostream es(err);
  if (llvm::verifyModule(*m, &es))
    throw UserError(fmt::format("kernel {}: {} is not valid LLVM IR: {}", entry, o.path, err));
  llvm::UpgradeDebugInfo(*m);
  if (!m->getFunction(entry))
    throw UserError(fmt::format("kernel {}: {} defines no function @{}", entry, o.path, entry));
  return m;
}

/// PTX is parsed by the driver only, on the GPU; what can be checked here is that the override still
/// defines the kernel's entry, whose absence the driver would report as a bare "named symbol not found".
void check_ptx_override(const StageOverride& o, const std::string& entry) {
  for (size_t pos = o.text.find(".entry"); pos != std::string::npos; pos = o.text.find(".entry", pos + 1)) {
    size_t name = o.text.find_first_not_of(" \t", pos + 6);
    if (name != std::string::npos && o.text.compare(name, entry.size(), entry) == 0) {
      char after = name + entry.size() < o.text.size() ? o.text[name + entry.size()] : '\0';
      if (after == '(' || after == ' ' || after == '\t' || after == '\n') return;
    }
  }
  throw UserError(fmt::format("kernel {}: {} defines no .entry {}", entry, o.path, entry));
}

/// 32-bit words of one tile value a thread may hold: four times the 255 registers a thread can have.
/// Past it the lowering (every element of a thread's share is its own LLVM value) makes straight-line
/// code that LLVM's optimizer and PTX emission take superlinear time over (a 512x512 fp32 tile on 128
/// threads, 2048 words each: 20 s) for a kernel that could only run by spilling nearly all of it.
constexpr int64_t kMaxWordsPerThread = 1024;

/// UserError with the DSL line for the first tile value beyond kMaxWordsPerThread.
void check_tile_sizes(const ir::Kernel& k) {
  const int64_t threads = int64_t{k.num_warps} * 32;
  ir::walk(const_cast<ir::Block&>(k.body), [&](ir::Op& op) {
    for (const ir::Value* v : op.results) {
      if (!v->type.is_tile()) continue;
      const int64_t words = (v->type.numel() * dtype_bytes(v->type.dtype) + 3) / 4;
      const int64_t per_thread = (words + threads - 1) / threads;
      if (per_thread > kMaxWordsPerThread)
        throw UserError(op.loc, fmt::format("{} needs {} registers per thread on {} threads; the GPU backend takes "
                                            "at most {} per tile (a thread has 255): use smaller tiles or more warps",
                                            v->type.str(), per_thread, threads, kMaxWordsPerThread));
    }
  });
}

/// A plan that needs more shared memory than the target gives one block can never launch: a UserError at
/// the DSL line of the largest buffer, listing the largest ones with their sizes, before any lowering.
void check_shared_memory_fits(const passes::SmemPlan& plan, const ir::Kernel& k, const GpuTarget& target) {
  if (plan.total_bytes <= target.max_smem_bytes()) return;
  std::vector<std::pair<const ir::Value*, const passes::SmemBuffer*>> buffers;
  for (const auto& [v, b] : plan.buffers) buffers.emplace_back(v, &b);
  std::sort(buffers.begin(), buffers.end(),
            [](const auto& a, const auto& b) { return a.second->bytes > b.second->bytes; });
  std::string largest;
  for (size_t i = 0; i < buffers.size() && i < 4; ++i) {
    const auto& [v, b] = buffers[i];
    const SourceLoc loc = v->def ? v->def->loc : SourceLoc{};
    largest += fmt::format("{}{} at {}: {} bytes{}", i ? "; " : "", v->type.str(),
                           loc.known() ? loc.str() : "(no DSL line)", b->bytes,
                           b->stages > 1 ? fmt::format(" ({} pipeline stages)", b->stages) : "");
  }
  if (plan.scratch_bytes > 0) largest += fmt::format("; reduction and scan scratch: {} bytes", plan.scratch_bytes);
  // One line: the CLI and the C ABI report the first line of a message.
  const std::string msg = fmt::format(
      "kernel {} needs {} bytes of shared memory; {} gives a block at most {}. The largest buffers: {}. Use "
      "smaller tiles (chunk or block sizes), one pipeline stage (set_num_stages(1)), or 16-bit tiles",
      k.name, plan.total_bytes, target.name(), target.max_smem_bytes(), largest);
  const SourceLoc where = buffers.empty() || !buffers[0].first->def ? k.loc : buffers[0].first->def->loc;
  throw UserError(where, msg);
}

}  // namespace

CompiledKernel compile_kernel(const ir::Kernel& k, const GpuTarget& target,
                              const std::optional<StageOverride>& replaced, Stage last) {
  auto replaces = [&](OverrideStage s) { return replaced && replaced->stage == s; };
  init_nvptx();
  CompiledKernel out;
  out.entry = k.name;
  out.tir = ir::print(k);
  out.num_threads = k.num_warps * 32;  // with the producer warps once the pipeline is planned
  passes::LayoutMap layouts = passes::assign_layouts(k, target.uses_wgmma());
  const passes::DotAccumulators accumulators = passes::find_dot_accumulators(k, layouts);
  out.tir_layouts = passes::print_with_layouts(k, layouts, &accumulators);
  if (last == Stage::layouts) return out;
  passes::SmemPlan plan = passes::plan_shared_memory(k, layouts, passes::plan_pipelining(k, target.tma()), target.max_smem_bytes(),
                                                     target.dots());
  plan.deferred_waits = passes::deferred_wgmma_waits(k, plan, accumulators);
  if (target.sm90_first_use_waits) plan.first_use_waits = passes::first_use_wgmma_waits(plan);
  out.smem_plan = passes::print_smem_plan(k, plan);
  out.smem_bytes = plan.total_bytes;
  out.num_threads = passes::block_threads(k, plan.pipeline.producer);
  out.reallocates_registers = plan.pipeline.producer.loop != nullptr;
  if (last == Stage::smem) return out;
  check_tile_sizes(k);  // what the lowering can hold (the earlier stages are for any size)
  check_shared_memory_fits(plan, k, target);  // (--emit smem still shows a plan that does not fit)

  llvm::LLVMContext ctx;
  auto m = std::make_unique<llvm::Module>(k.name, ctx);
  llvm::Triple triple("nvptx64-nvidia-cuda");
  m->setTargetTriple(triple);
  m->addModuleFlag(llvm::Module::Warning, "Debug Info Version", llvm::DEBUG_METADATA_VERSION);
  // The lowering runs even under an override: its parameter list is the launch ABI.
  KernelLowering(k, layouts, accumulators, plan, *m, &out.params, &out.tensor_maps, target.sm).run();
  std::string err;
  llvm::raw_string_ostream es(err);
  if (llvm::verifyModule(*m, &es))
    throw InternalError(fmt::format("the lowering of {} produced invalid LLVM IR: {}", k.name, err));
  if (replaces(OverrideStage::llvm)) m = parse_override(*replaced, k.name, ctx);
  out.llvm_ir = to_string(*m);
  if (last == Stage::llvm) return out;

  const llvm::Target* t = llvm::TargetRegistry::lookupTarget(triple, err);
  if (!t) throw InternalError("NVPTX target missing from this LLVM: " + err);
  llvm::TargetOptions opts;
  // PTX 8.6 is what LLVM 22 emits for sm_90a; the CUDA 13 driver JIT accepts it for sm_80 too.
  std::unique_ptr<llvm::TargetMachine> tm(
      t->createTargetMachine(triple, target.name(), "+ptx86", opts, std::nullopt, std::nullopt,
                             llvm::CodeGenOptLevel::Aggressive));
  m->setTargetTriple(triple);  // an override's module may name another target, or none
  m->setDataLayout(tm->createDataLayout());

  if (replaces(OverrideStage::llvm_opt)) {
    m = parse_override(*replaced, k.name, ctx);
    m->setTargetTriple(triple);
    m->setDataLayout(tm->createDataLayout());
  } else {
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
    mpm.run(*m, mam);
  }
  out.llvm_ir_opt = to_string(*m);
  if (last == Stage::llvm_opt) return out;
  if (replaces(OverrideStage::ptx)) {
    check_ptx_override(*replaced, k.name);
    out.ptx = replaced->text;
    return out;
  }

  llvm::SmallString<0> ptx;
  llvm::raw_svector_ostream ps(ptx);
  llvm::legacy::PassManager cg;
  if (tm->addPassesToEmitFile(cg, ps, nullptr, llvm::CodeGenFileType::AssemblyFile))
    throw InternalError("NVPTX cannot emit assembly");
  cg.run(*m);
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
