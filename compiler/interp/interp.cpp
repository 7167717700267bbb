// The interpreter's driver: argument checks, the grid of programs (spread over host threads), and
// the structured control flow of one program. The ops themselves are evaluated by the *_ops.cpp
// files through frame.h.
#include "compiler/interp/interp.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <system_error>
#include <thread>

#include "compiler/interp/frame.h"
#include "compiler/interp/number_formats.h"

namespace linac::interp {

using ir::OpCode;

const TensorArg& Frame::tensor_operand(const ir::Op& op, size_t i) const {
  if (i >= op.operands.size()) malformed(op, "missing tensor operand");
  const TensorArg* t = tensors[op.operands[i]->id];
  if (t == nullptr) malformed(op, "operand is not a tensor parameter");
  return *t;
}

Buffer& Frame::result(const ir::Op& op, size_t i) {
  const ir::Value* v = op.results[i];
  Buffer& b = slots[v->id];
  b.resize(static_cast<size_t>(v->type.numel()));
  return b;
}

std::string program_context(const Frame& f) {
  return fmt::format("kernel '{}', program ({}, {}, {})", f.kernel->name, f.program_id[0], f.program_id[1],
                     f.program_id[2]);
}

void malformed(const ir::Op& op, std::string_view what) {
  throw InternalError(fmt::format("interpreter: malformed IR at '{}' ({}): {}; run the verifier first",
                                  ir::opcode_name(op.code), op.loc.str(), what));
}

namespace {

/// Executes the body of one program in a Frame.
class ProgramRunner {
 public:
  explicit ProgramRunner(Frame& f) : f_(f) {}

  void run() {
    if (const ir::Op* y = exec_block(f_.kernel->body)) malformed(*y, "yield in the kernel body");
  }

 private:
  /// Runs the ops of `b` up to its terminator; returns the Yield, or null for a block without one.
  const ir::Op* exec_block(const ir::Block& b) {
    for (const auto& op : b.ops) {
      check_operands(*op);
      if (op->code == OpCode::Yield) return op.get();
      exec_op(*op);
    }
    return nullptr;
  }

  /// Guards against IR that would make an evaluator read outside a buffer: every operand must be
  /// a value of this kernel whose buffer holds as many elements as its type says.
  void check_operands(const ir::Op& op) const {
    for (const ir::Value* v : op.operands) {
      if (v == nullptr || v->id < 0 || v->id >= static_cast<int>(f_.slots.size()))
        malformed(op, "operand is not a value of this kernel");
      if (v->type.is_tensor()) {
        if (f_.tensors[v->id] == nullptr) malformed(op, "tensor operand is not a kernel parameter");
      } else if (f_.slots[v->id].size() != static_cast<size_t>(v->type.numel())) {
        malformed(op, fmt::format("operand %{} is used before it is defined", v->id));
      }
    }
  }

  void exec_op(const ir::Op& op) {
    const size_t expected_results = op.code == OpCode::Store || op.code == OpCode::Signal || op.code == OpCode::Wait ? 0 : 1;
    if (op.code != OpCode::For && op.code != OpCode::If && op.results.size() != expected_results)
      malformed(op, "wrong number of results");
    switch (op.code) {
      case OpCode::Constant:
      case OpCode::ProgramId:
      case OpCode::NumPrograms:
      case OpCode::Dim:
      case OpCode::Iota:
        return eval_leaf(op, f_);
      case OpCode::Splat:
      case OpCode::Broadcast:
      case OpCode::ExpandDims:
      case OpCode::Reshape:
      case OpCode::Transpose:
      case OpCode::Take:
      case OpCode::Slice:
      case OpCode::Concat:
      case OpCode::Place:
        return eval_shape(op, f_);
      case OpCode::Reduce:
      case OpCode::Scan:
      case OpCode::Dot:
        return eval_reduction(op, f_);
      case OpCode::Load:
      case OpCode::Store:
        return eval_memory(op, f_);
      case OpCode::Signal:
      case OpCode::Wait:
        return eval_flag(op, f_);
      case OpCode::For:
        return exec_for(op);
      case OpCode::If:
        return exec_if(op);
      case OpCode::Yield:
        malformed(op, "yield is not at the end of a region");
      default:
        if (!ir::is_elementwise(op.code)) malformed(op, "opcode the interpreter does not know");
        return eval_elementwise(op, f_);
    }
  }

  /// The yield that ends `region`, checked to pass one value per entry of `types`.
  const ir::Op& run_region(const ir::Op& op, const ir::Block& region, const std::vector<const ir::Type*>& types) {
    const ir::Op* y = exec_block(region);
    if (y == nullptr) malformed(op, "region does not end in yield");
    if (y->operands.size() != types.size()) malformed(op, "yield passes the wrong number of values");
    for (size_t i = 0; i < types.size(); ++i)
      if (y->operands[i]->type.numel() != types[i]->numel()) malformed(op, "yield value shape mismatch");
    return *y;
  }

  void exec_for(const ir::Op& op) {
    if (op.operands.size() < 3 || op.regions.size() != 1) malformed(op, "for needs lo, hi, step and one region");
    const ir::Block& body = *op.regions[0];
    const size_t num_carried = op.operands.size() - 3;
    if (body.args.size() != num_carried + 1 || op.results.size() != num_carried)
      malformed(op, "for block arguments must be (iv, carried...) with one result per carried value");
    for (size_t i = 0; i < 3; ++i)
      if (!op.operands[i]->type.is_scalar()) malformed(op, "lo, hi and step must be scalars");
    const int64_t lo = to_i64(f_.scalar_operand(op, 0)), hi = to_i64(f_.scalar_operand(op, 1));
    const int64_t step = to_i64(f_.scalar_operand(op, 2));
    if (step <= 0)
      throw UserError(op.loc, fmt::format("for loop step must be positive, got {} ({})", step, program_context(f_)));

    std::vector<const ir::Type*> carried_types;
    for (size_t i = 0; i < num_carried; ++i) {
      const ir::Value* arg = body.args[i + 1];
      if (arg->type.numel() != op.operands[3 + i]->type.numel())
        malformed(op, "init shape differs from the carried value");
      carried_types.push_back(&arg->type);
      f_.slots[arg->id] = f_.slots[op.operands[3 + i]->id];
    }
    Buffer& iv_buffer = f_.slots[body.args[0]->id];
    const DType iv_type = body.args[0]->type.dtype;
    std::vector<Buffer> next(num_carried);  // reused by every iteration
    for (int64_t iv = lo; iv < hi;) {
      iv_buffer.assign(1, round_to(iv_type, static_cast<double>(iv)));
      const ir::Op& y = run_region(op, body, carried_types);
      // Copy all yielded values before overwriting any carried one: a yield may pass carried values
      // on in another order (a swap), or unchanged.
      for (size_t i = 0; i < num_carried; ++i) next[i] = f_.slots[y.operands[i]->id];
      for (size_t i = 0; i < num_carried; ++i) f_.slots[body.args[i + 1]->id].swap(next[i]);
      // Unsigned distance: iv + step could overflow int64 when hi is near its maximum.
      if (static_cast<uint64_t>(hi) - static_cast<uint64_t>(iv) <= static_cast<uint64_t>(step)) break;
      iv += step;
    }
    for (size_t i = 0; i < num_carried; ++i) f_.slots[op.results[i]->id] = f_.slots[body.args[i + 1]->id];
  }

  void exec_if(const ir::Op& op) {
    if (op.operands.size() != 1 || op.regions.empty() || op.regions.size() > 2)
      malformed(op, "if needs a condition and a then (and else) region");
    if (!op.operands[0]->type.is_scalar()) malformed(op, "the condition must be a scalar");
    const size_t branch = f_.scalar_operand(op, 0) != 0 ? 0 : 1;
    if (branch >= op.regions.size()) {
      if (!op.results.empty()) malformed(op, "if with results needs an else region");
      return;
    }
    std::vector<const ir::Type*> types;
    for (const ir::Value* r : op.results) types.push_back(&r->type);
    const ir::Op& y = run_region(op, *op.regions[branch], types);
    for (size_t i = 0; i < op.results.size(); ++i) f_.slots[op.results[i]->id] = f_.slots[y.operands[i]->id];
  }

  Frame& f_;
};

std::string describe(const ir::Type& t) {
  if (t.is_tensor()) return fmt::format("a rank-{} {} tensor", t.rank(), dtype_name(t.dtype));
  return fmt::format("a {} scalar", dtype_name(t.dtype));
}

void check_args(const ir::Kernel& k, Grid grid, std::span<const Arg> args) {
  if (grid.x < 0 || grid.y < 0 || grid.z < 0)
    throw UserError(fmt::format("kernel '{}': grid ({}, {}, {}) has a negative size", k.name, grid.x, grid.y, grid.z));
  if (args.size() != k.params.size())
    throw UserError(fmt::format("kernel '{}' takes {} arguments, got {}", k.name, k.params.size(), args.size()));
  for (size_t i = 0; i < args.size(); ++i) {
    const ir::Param& p = k.params[i];
    const ir::Type& type = p.value->type;
    const auto prefix = [&] { return fmt::format("kernel '{}', parameter '{}' ({})", k.name, p.name, describe(type)); };
    if (type.is_tile()) throw InternalError(fmt::format("{}: a parameter cannot be a tile", prefix()));
    if (type.is_scalar()) {
      if (!std::holds_alternative<double>(args[i])) throw UserError(fmt::format("{}: got a tensor", prefix()));
      continue;
    }
    const auto* t = std::get_if<TensorArg>(&args[i]);
    if (t == nullptr) throw UserError(fmt::format("{}: got a scalar", prefix()));
    if (t->dtype != type.dtype) throw UserError(fmt::format("{}: got a {} tensor", prefix(), dtype_name(t->dtype)));
    if (t->shape.size() != static_cast<size_t>(type.rank()) || t->strides.size() != static_cast<size_t>(type.rank()))
      throw UserError(
          fmt::format("{}: got a tensor with {} dims and {} strides", prefix(), t->shape.size(), t->strides.size()));
    int64_t numel = 1;
    for (int64_t d : t->shape) {
      if (d < 0) throw UserError(fmt::format("{}: shape [{}] has a negative dim", prefix(), fmt::join(t->shape, ", ")));
      numel *= d;
    }
    if (t->data == nullptr && numel != 0)
      throw UserError(fmt::format("{}: data is null but the shape [{}] has {} elements", prefix(),
                                  fmt::join(t->shape, ", "), numel));
  }
}

/// A frame with the arguments bound; programs of one thread share it (their values are overwritten
/// before they are read, and the buffers keep their capacity).
Frame make_frame(const ir::Kernel& k, Grid grid, std::span<const Arg> args) {
  Frame f;
  f.kernel = &k;
  f.slots.resize(k.num_values());
  f.tensors.assign(k.num_values(), nullptr);
  f.num_programs = {grid.x, grid.y, grid.z};
  for (size_t i = 0; i < args.size(); ++i) {
    const ir::Value* v = k.params[i].value;
    if (const auto* t = std::get_if<TensorArg>(&args[i]))
      f.tensors[v->id] = t;
    else
      f.slots[v->id].assign(1, round_to(v->type.dtype, std::get<double>(args[i])));
  }
  return f;
}

}  // namespace

void run(const ir::Kernel& k, Grid grid, std::span<const Arg> args) {
  run(k, grid, args, RunOptions{});
}

void run(const ir::Kernel& k, Grid grid, std::span<const Arg> args, const RunOptions& options) {
  check_args(k, grid, args);
  const int64_t total = grid.x * grid.y * grid.z;
  if (total == 0) return;
  int64_t threads = options.num_threads > 0 ? options.num_threads : std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, total);
  const int64_t chunk = (total + threads - 1) / threads;

  // Each thread runs a contiguous range of programs (x fastest, as CUDA numbers blocks) and stops at
  // its first error, or when a lower range has failed. The error reported is that of the lowest
  // failing range, i.e. of the lowest failing program, whatever the thread timing.
  std::vector<std::exception_ptr> errors(threads);
  std::atomic<int64_t> first_failed{std::numeric_limits<int64_t>::max()};
  auto work = [&](int64_t t) {
    Frame f = make_frame(k, grid, args);
    for (int64_t p = t * chunk; p < std::min(total, (t + 1) * chunk); ++p) {
      if (first_failed.load(std::memory_order_relaxed) < t) return;
      f.program_id = {p % grid.x, (p / grid.x) % grid.y, p / (grid.x * grid.y)};
      try {
        ProgramRunner(f).run();
      } catch (...) {
        errors[t] = std::current_exception();
        int64_t seen = first_failed.load();
        while (t < seen && !first_failed.compare_exchange_weak(seen, t)) {
        }
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  int64_t started = 1;
  try {
    for (; started < threads; ++started) pool.emplace_back(work, started);
  } catch (const std::system_error&) {
    // No more threads from the OS: the calling thread runs the ranges that got none.
  }
  work(0);
  for (int64_t t = started; t < threads; ++t) work(t);
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace linac::interp
