// KernelBuilder, the thread's recording context, and structured control flow (for, if).
#include <fmt/format.h>

#include <atomic>

#include "compiler/ir/verifier.h"
#include "dsl/src/context.h"

namespace linac::dsl {

namespace {
thread_local std::vector<KernelBuilder::Impl*> t_builders;
std::atomic<uint64_t> g_next_builder_id{1};

/// The live builder of this thread with serial number `id`, or null.
KernelBuilder::Impl* find_builder(uint64_t id) {
  for (KernelBuilder::Impl* b : t_builders)
    if (b->id == id) return b;
  return nullptr;
}

uint64_t innermost_builder_id() { return t_builders.empty() ? 0 : t_builders.back()->id; }

/// UserError at `loc` unless the handle (a Tile or Tensor named `what`) is set and its builder is
/// alive on this thread; returns that builder.
KernelBuilder::Impl& owner(ir::Value* v, uint64_t builder, const Loc& loc, const char* what, const char* kind) {
  const std::string subject = what ? fmt::format("{} is a", what) : "this is a";
  if (!v) throw UserError(SourceLoc::from(loc), fmt::format("{}n empty {} (never assigned a value)", subject, kind));
  KernelBuilder::Impl* b = find_builder(builder);
  if (!b)
    throw UserError(SourceLoc::from(loc),
                    fmt::format("{} {} whose KernelBuilder is gone (or records on another thread): a {} is usable "
                                "only while the KernelBuilder that made it is alive",
                                subject, kind, kind));
  return *b;
}

/// owner(), and that owner must be the builder recording now.
ir::Value* use_in_current(ir::Value* v, uint64_t builder, const Loc& loc, const char* what, const char* kind) {
  KernelBuilder::Impl& mine = owner(v, builder, loc, what, kind);
  KernelBuilder::Impl& now = detail::current(loc);
  if (&mine != &now)
    throw UserError(SourceLoc::from(loc),
                    fmt::format("{} is a {} of kernel '{}' (KernelBuilder at {}), used in kernel '{}' (KernelBuilder "
                                "at {}): a {} belongs to the kernel that made it",
                                what, kind, mine.kernel->name, mine.kernel->loc.str(), now.kernel->name,
                                now.kernel->loc.str(), kind));
  return v;
}

/// Makes `block` the insertion point for the lifetime of the guard, even when the body throws.
class BlockScope {
 public:
  BlockScope(KernelBuilder::Impl& b, ir::Block* block) : b_(b) { b_.blocks.push_back(block); }
  ~BlockScope() { b_.blocks.pop_back(); }
  BlockScope(const BlockScope&) = delete;
  BlockScope& operator=(const BlockScope&) = delete;

 private:
  KernelBuilder::Impl& b_;
};
}  // namespace

namespace detail {

KernelBuilder::Impl& current(const Loc& loc) {
  if (t_builders.empty() || t_builders.back()->finished)
    throw UserError(SourceLoc::from(loc), "DSL call outside of a kernel: create a KernelBuilder first");
  return *t_builders.back();
}

ir::Op* emit(ir::OpCode code, std::vector<ir::Value*> operands, std::vector<ir::Type> result_types,
             ir::Attrs attrs, const Loc& loc) {
  auto& b = current(loc);
  ir::Op* op = ir::append_op(*b.kernel, *b.blocks.back(), code, std::move(operands),
                             std::move(result_types), std::move(attrs), SourceLoc::from(loc));
  if (code != ir::OpCode::For && code != ir::OpCode::If && code != ir::OpCode::Yield) ir::verify_op(*op, ir::Spelling::dsl);
  return op;
}

Tile make_constant(double value, DType t, const Loc& loc) {
  ir::Attrs a;
  if (is_float(t))
    a.fvalue = value;
  else
    a.ivalue = static_cast<int64_t>(value);
  return Tile(emit1(ir::OpCode::Constant, {}, ir::Type::scalar(t), a, loc));
}

Tile materialize(const Operand& o, DType t) {
  if (!o.is_number) return o.tile;
  if (!o.is_integer_number && is_int(t))
    throw UserError(SourceLoc::from(o.loc),
                    fmt::format("the number {} is not an integer but the other operand is {}", o.number,
                                dtype_name(t)));
  return make_constant(o.number, t, o.loc);
}

ir::Value* use(const Tile& t, const Loc& loc, const char* what) {
  return use_in_current(t.value(), t.builder(), loc, what, "Tile");
}

ir::Value* use(const Tensor& t, const Loc& loc, const char* what) {
  return use_in_current(t.value(), t.builder(), loc, what, "Tensor");
}

ir::Value* inspect(const Tile& t, const Loc& loc) {
  owner(t.value(), t.builder(), loc, nullptr, "Tile");
  return t.value();
}

ir::Value* inspect(const Tensor& t, const Loc& loc) {
  owner(t.value(), t.builder(), loc, nullptr, "Tensor");
  return t.value();
}

void for_range(const Operand& lo, const Operand& hi, const std::function<void(Tile)>& body,
               std::span<Tile* const> carried) {
  const Loc& loc = lo.loc;
  auto& b = current(loc);
  ir::Value* lo_v = use(materialize(lo, DType::i32), loc, "the loop's lower bound");
  ir::Value* hi_v = use(materialize(hi, DType::i32), loc, "the loop's upper bound");
  ir::Value* step = make_constant(1, DType::i32, loc).value();

  std::vector<ir::Value*> operands = {lo_v, hi_v, step};
  std::vector<ir::Type> types;
  for (size_t i = 0; i < carried.size(); ++i) {
    ir::Value* init = use(*carried[i], loc, fmt::format("loop-carried variable #{}", i).c_str());
    operands.push_back(init);
    types.push_back(init->type);
  }
  ir::Op* op = emit(ir::OpCode::For, operands, types, {}, loc);
  auto region = std::make_unique<ir::Block>();
  region->parent = op;
  ir::Value* iv = b.kernel->new_value(ir::Type::scalar(DType::i32));
  iv->owner = region.get();
  region->args.push_back(iv);
  for (size_t i = 0; i < carried.size(); ++i) {
    ir::Value* arg = b.kernel->new_value(types[i]);
    arg->owner = region.get();
    region->args.push_back(arg);
    *carried[i] = Tile(arg);
  }
  ir::Block* body_block = region.get();
  op->regions.push_back(std::move(region));
  {
    BlockScope scope(b, body_block);
    body(Tile(iv));
    std::vector<ir::Value*> yielded;
    for (size_t i = 0; i < carried.size(); ++i)
      yielded.push_back(use(*carried[i], loc, fmt::format("loop-carried variable #{}", i).c_str()));
    emit(ir::OpCode::Yield, yielded, {}, {}, loc);
  }
  for (size_t i = 0; i < carried.size(); ++i) *carried[i] = Tile(op->results[i]);
  ir::verify_op(*op, ir::Spelling::dsl);
}

void if_then_else(const Operand& cond, const std::function<void()>& then_body,
                  const std::function<void()>* else_body, std::span<Tile* const> carried) {
  const Loc& loc = cond.loc;
  auto& b = current(loc);
  ir::Value* c = use(materialize(cond, DType::i1), loc, "the condition");
  std::vector<Tile> before;
  std::vector<ir::Type> types;
  for (size_t i = 0; i < carried.size(); ++i) {
    before.push_back(*carried[i]);
    types.push_back(use(*carried[i], loc, fmt::format("variable #{} of the if", i).c_str())->type);
  }
  ir::Op* op = emit(ir::OpCode::If, {c}, types, {}, loc);
  auto run_branch = [&](const std::function<void()>* fn) {
    auto region = std::make_unique<ir::Block>();
    region->parent = op;
    ir::Block* block = region.get();
    op->regions.push_back(std::move(region));
    for (size_t i = 0; i < carried.size(); ++i) *carried[i] = before[i];
    BlockScope scope(b, block);
    if (fn) (*fn)();
    std::vector<ir::Value*> yielded;
    for (size_t i = 0; i < carried.size(); ++i)
      yielded.push_back(use(*carried[i], loc, fmt::format("variable #{} of the if", i).c_str()));
    emit(ir::OpCode::Yield, yielded, {}, {}, loc);
  };
  run_branch(&then_body);
  run_branch(else_body);
  for (size_t i = 0; i < carried.size(); ++i) *carried[i] = Tile(op->results[i]);
  ir::verify_op(*op, ir::Spelling::dsl);
}

}  // namespace detail

Tile::Tile(ir::Value* v) : v_(v), builder_(v ? innermost_builder_id() : 0) {}

Tensor::Tensor(ir::Value* v) : v_(v), builder_(v ? innermost_builder_id() : 0) {}

KernelBuilder::KernelBuilder(std::string name, Loc loc) : impl_(std::make_unique<Impl>()) {
  impl_->id = g_next_builder_id++;
  impl_->kernel = std::make_shared<ir::Kernel>();
  impl_->kernel->name = std::move(name);
  impl_->kernel->loc = SourceLoc::from(loc);
  impl_->blocks.push_back(&impl_->kernel->body);
  t_builders.push_back(impl_.get());
}

KernelBuilder::~KernelBuilder() {
  // Builders nest as a stack; remove ours wherever it is (an exception may unwind several at once).
  std::erase(t_builders, impl_.get());
}

Tensor KernelBuilder::tensor(std::string name, DType dtype, int rank, Loc loc) {
  if (rank < 1 || rank > 8)
    throw UserError(SourceLoc::from(loc), fmt::format("tensor '{}' must have rank 1..8, got {}", name, rank));
  if (impl_->kernel->find_param(name))
    throw UserError(SourceLoc::from(loc), fmt::format("parameter '{}' is declared twice", name));
  return Tensor(impl_->kernel->add_param(std::move(name), ir::Type::tensor(dtype, rank)), impl_->id);
}

Tile KernelBuilder::scalar(std::string name, DType dtype, Loc loc) {
  if (dtype == DType::i1)
    throw UserError(SourceLoc::from(loc), fmt::format("scalar parameter '{}' cannot be i1", name));
  if (impl_->kernel->find_param(name))
    throw UserError(SourceLoc::from(loc), fmt::format("parameter '{}' is declared twice", name));
  return Tile(impl_->kernel->add_param(std::move(name), ir::Type::scalar(dtype)), impl_->id);
}

void KernelBuilder::set_num_warps(int n) { impl_->kernel->num_warps = n; }
void KernelBuilder::set_num_stages(int n) { impl_->kernel->num_stages = n; }
void KernelBuilder::set_min_ctas_per_sm(int n) { impl_->kernel->min_ctas_per_sm = n; }
void KernelBuilder::set_tensor_core_f32(bool on) { impl_->kernel->tensor_core_f32 = on; }
void KernelBuilder::set_producer_warps(int n) { impl_->kernel->producer_warps = n; }

std::shared_ptr<ir::Kernel> KernelBuilder::finish() {
  if (impl_->finished) throw UserError(impl_->kernel->loc, "KernelBuilder::finish called twice");
  impl_->finished = true;
  ir::verify(*impl_->kernel, ir::Spelling::dsl);
  return impl_->kernel;
}

}  // namespace linac::dsl
