#include "compiler/passes/layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <set>

#include "compiler/ir/printer.h"
#include "compiler/passes/dot_accumulate.h"

namespace linac::passes {

using ir::OpCode;

Layout Layout::blocked(std::vector<int64_t> shape, int num_threads, int elem_bytes) {
  Layout l;
  l.kind = Kind::Blocked;
  l.shape = std::move(shape);
  l.num_threads = num_threads;
  int64_t n = l.numel();
  // Up to 16 bytes per thread per pass, as long as a pass of the whole program fits in the tile and
  // each run of `vec` elements stays inside one row.
  int64_t inner = l.shape.back();
  int vec = std::max(1, 16 / std::max(1, elem_bytes));
  while (vec > 1 && (n % (int64_t{num_threads} * vec) != 0 || inner % vec != 0)) vec /= 2;
  l.vec = vec;
  return l;
}

bool Layout::mma_fits(const std::vector<int64_t>& shape) {
  return shape.size() == 2 && shape[0] % 16 == 0 && shape[1] % 8 == 0;
}

Layout Layout::mma(std::vector<int64_t> shape, int num_warps, bool warpgroups) {
  Layout l;
  l.kind = Kind::Mma;
  l.warpgroups = warpgroups;
  l.shape = std::move(shape);
  l.num_threads = num_warps * 32;
  int64_t mt = l.shape[0] / 16, nt = l.shape[1] / 8;
  // Warps go along M first (each warp then owns whole rows: reductions along N stay in the warp).
  int wm = 1;
  while (wm * 2 <= num_warps && mt % (wm * 2) == 0) wm *= 2;
  int wn = 1;
  while (wm * wn * 2 <= num_warps && nt % (wn * 2) == 0) wn *= 2;
  l.wm = wm;
  l.wn = wn;
  return l;
}

Layout Layout::fused(std::vector<int64_t> shape) {
  Layout l;
  l.kind = Kind::Fused;
  l.shape = std::move(shape);
  return l;
}

int64_t Layout::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool registers_are_a_fragments(const Layout& a, const Layout& result) {
  return a.kind == Layout::Kind::Mma && result.kind == Layout::Kind::Mma && a.wn == 1 && result.wn == 1 &&
         a.wm == result.wm && a.warpgroups == result.warpgroups;
}

int row_run(const Layout& l) {
  if (l.shape.size() != 2) return 1;
  switch (l.kind) {
    case Layout::Kind::Mma: return 2;  // columns tn * 8 + 2 (lane % 4), and the next
    case Layout::Kind::Blocked: {
      // The thread's first column is a multiple of vec where vec divides the row and a pass covers whole
      // rows or divides one (the lowering's coords_of adds the register's part per axis then).
      const int64_t n = l.shape[1], per_pass = int64_t{l.num_threads} * l.vec;
      const int64_t covered = per_pass * ((l.regs_per_thread() + l.vec - 1) / l.vec);
      const bool rows_split_exactly = covered <= l.numel() && (per_pass % n == 0 || n % per_pass == 0);
      return rows_split_exactly && n % l.vec == 0 ? l.vec : 1;
    }
    default: return 1;
  }
}

namespace {

bool power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

int log2_exact(int64_t x) {
  int b = 0;
  while ((int64_t{1} << b) < x) ++b;
  return b;
}

/// The axis each bit of the thread index moves a 2-D layout's thread part along (0 rows, 1 columns, -1 a
/// replica of other threads), and each register's part as {row, column}; nullopt where a bit moves
/// both or a register's part depends on the thread (blocked passes that neither cover whole rows nor
/// divide them).
struct ThreadSplit {
  std::vector<int> bit_axes;
  std::vector<std::array<int64_t, 2>> register_parts;
};

std::optional<ThreadSplit> thread_split(const Layout& l) {
  if (l.shape.size() != 2 || !power_of_two(l.num_threads)) return std::nullopt;
  ThreadSplit s;
  const int bits = log2_exact(l.num_threads);
  if (l.kind == Layout::Kind::Mma) {
    // Lane l: row l / 4, columns 2 (l % 4) (+1); warps per mma_warp's placement, replicas above wm * wn.
    s.bit_axes = {1, 1, 0, 0, 0};
    const int m_bits = log2_exact(l.wm), n_bits = log2_exact(l.wn);
    const std::vector<int> order = l.warpgroups ? std::vector<int>{0, 1} : std::vector<int>{1, 0};
    for (int axis : order)
      for (int i = 0; i < (axis == 0 ? m_bits : n_bits); ++i) s.bit_axes.push_back(axis);
    while (static_cast<int>(s.bit_axes.size()) < bits) s.bit_axes.push_back(-1);
    if (static_cast<int>(s.bit_axes.size()) != bits) return std::nullopt;
    for (int r = 0; r < l.regs_per_thread(); ++r) {
      const auto rc = l.register_coords(r);
      s.register_parts.push_back({rc[0], rc[1]});
    }
    return s;
  }
  if (l.kind != Layout::Kind::Blocked) return std::nullopt;
  const int64_t n = l.shape[1], per_pass = int64_t{l.num_threads} * l.vec;
  if (!power_of_two(n) || !power_of_two(l.vec) || l.numel() % per_pass != 0) return std::nullopt;
  if (per_pass % n == 0) {
    // Thread t starts at element t vec: its low bits walk a row, the others the rows of a pass.
    const int col_bits = log2_exact(n / l.vec);
    for (int b = 0; b < bits; ++b) s.bit_axes.push_back(b < col_bits ? 1 : 0);
  } else if (n % per_pass == 0) {
    s.bit_axes.assign(bits, 1);  // a pass lies within one row
  } else {
    return std::nullopt;
  }
  for (int r = 0; r < l.regs_per_thread(); ++r) {
    const int64_t pass = r / l.vec, el = r % l.vec;
    if (per_pass % n == 0)
      s.register_parts.push_back({pass * (per_pass / n), el});
    else
      s.register_parts.push_back({pass / (n / per_pass), (pass % (n / per_pass)) * per_pass + el});
  }
  return s;
}

}  // namespace

std::optional<RegisterReduction> register_reduction(const ir::Op& op, const Layout& l, bool held) {
  if (op.code != ir::OpCode::Reduce) return std::nullopt;
  const ir::Value* x = op.operands[0];
  if (x->type.rank() != 2 || op.result()->type.rank() != 1) return std::nullopt;
  const DType t = x->type.dtype;
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16 && t != DType::i32) return std::nullopt;
  if (held && l.kind == Layout::Kind::Blocked && l.regs_per_thread() > 64) return std::nullopt;
  const auto split = thread_split(l);
  if (!split) return std::nullopt;
  const int axis = static_cast<int>(op.attrs.axis), kept_axis = 1 - axis;
  RegisterReduction rr;
  rr.kept = x->type.shape[kept_axis];
  for (int b = 0; b < static_cast<int>(split->bit_axes.size()); ++b) {
    const int a = split->bit_axes[b];
    if (b < 5 && a == axis) rr.lane_xors.push_back(1 << b);
    if (b < 5 && a == -1) return std::nullopt;  // replicated lanes: not made by these layouts
    if (b >= 5 && a == axis) rr.slot_bits.push_back(b - 5);
    if (b >= 5 && a == -1) rr.replica_warps |= 1 << (b - 5);
  }
  // Widest first, as the row form before this one folded (the same sums, bit for bit).
  std::reverse(rr.lane_xors.begin(), rr.lane_xors.end());
  std::map<int64_t, std::vector<int>> by_kept;
  for (int r = 0; r < static_cast<int>(split->register_parts.size()); ++r)
    by_kept[split->register_parts[r][kept_axis]].push_back(r);
  for (auto& [part, regs] : by_kept) rr.groups.push_back(std::move(regs));
  return rr;
}

int Layout::regs_per_thread() const {
  switch (kind) {
    case Kind::Uniform: return 1;
    case Kind::Blocked: {
      int64_t per_pass = int64_t{num_threads} * vec;
      return static_cast<int>((numel() + per_pass - 1) / per_pass) * vec;
    }
    case Kind::Mma: return static_cast<int>((shape[0] / wm / 16) * (shape[1] / wn / 8) * 4);
    case Kind::Fused: return 0;
  }
  return 0;
}

std::vector<int64_t> Layout::register_coords(int r) const {
  switch (kind) {
    case Kind::Uniform: return {};
    case Kind::Blocked: {
      // Linear element index contributed by r: pass (r / vec) advances by a whole program's worth.
      // Blocked layouts are linear: this is the row-major element offset; the lowering adds the
      // thread's part (tid * vec) before splitting it into coordinates.
      return {int64_t{r / vec} * num_threads * vec + r % vec};
    }
    case Kind::Mma: {
      int64_t ntn = shape[1] / wn / 8;
      int64_t tile = r / 4, tm = tile / ntn, tn = tile % ntn;
      return {tm * 16 * (warpgroups ? wm : 1) + ((r % 4) / 2) * 8, tn * 8 + r % 2};
    }
    case Kind::Fused: break;
  }
  return {};
}

std::string Layout::str() const {
  switch (kind) {
    case Kind::Uniform: return "#uniform";
    case Kind::Blocked: return fmt::format("#blocked<vec={}>", vec);
    case Kind::Mma: return fmt::format("#mma<{}={}x{}>", warpgroups ? "warpgroups" : "warps", wm, wn);
    case Kind::Fused: return "#fused";
  }
  return "?";
}

Layout store_layout(const ir::Value* v, const Layout& own, bool is_data, int num_warps) {
  if (v->type.is_scalar()) return Layout::uniform();
  if (is_data && own.kind == Layout::Kind::Blocked) return own;
  return Layout::blocked(v->type.shape, num_warps * 32, dtype_bytes(v->type.dtype));
}

std::set<const ir::Value*> fused_rank3_values(const ir::Kernel& k) {
  std::set<const ir::Value*> fused;
  std::map<const ir::Value*, std::vector<const ir::Op*>> uses;
  ir::walk(const_cast<ir::Block&>(k.body), [&](ir::Op& op) {
    for (const ir::Value* o : op.operands) uses[o].push_back(&op);
    for (const ir::Value* v : op.results) {
      if (!v->type.is_tile() || v->type.rank() != 3) continue;
      const OpCode c = op.code;
      if (ir::is_elementwise(c) || c == OpCode::ExpandDims || c == OpCode::Broadcast || c == OpCode::Constant ||
          c == OpCode::Splat)
        fused.insert(v);
    }
  });
  // Drop the candidates with a use that is neither a reduction to rank 2 or less nor another candidate,
  // until none is left to drop.
  for (bool changed = true; changed;) {
    changed = false;
    for (auto it = fused.begin(); it != fused.end();) {
      bool ok = true;
      for (const ir::Op* use : uses[*it]) {
        const bool reduces = use->code == OpCode::Reduce && use->result()->type.rank() <= 2;
        const bool into_fused = !use->results.empty() && fused.count(use->result());
        ok = ok && (reduces || into_fused);
      }
      if (ok) {
        ++it;
      } else {
        it = fused.erase(it);
        changed = true;
      }
    }
  }
  return fused;
}

namespace {

class LayoutAssigner {
 public:
  LayoutAssigner(const ir::Kernel& k, bool warpgroups)
      : k_(k), num_warps_(k.num_warps), warpgroups_(warpgroups), fused_(fused_rank3_values(k)) {}

  LayoutMap run() {
    check_ranks(k_.body);
    for (const auto& p : k_.params)
      if (!p.value->type.is_tensor()) out_[p.value] = Layout::uniform();
    assign_block(k_.body);
    // Second round: elementwise math on views and index math (no operand in registers) takes the
    // layout its consumers want, so a gate matrix computed for an mma accumulator is computed in the
    // mma layout instead of being moved there through shared memory.
    // Loads (and their casts) feeding elementwise math in another blocked layout take that layout, so
    // that a bf16 tile loaded 8 per thread and multiplied with f32 math held 4 per thread is loaded 4
    // per thread instead of one of them being moved through shared memory (gla_fwd's Qf .* exp(..)).
    for (int round = 0; round < 2; ++round) {
      collect_wants(k_.body);
      assign_block(k_.body);
    }
    return std::move(out_);
  }

 private:
  Layout blocked_for(const ir::Type& t) const {
    return Layout::blocked(t.shape, num_warps_ * 32, dtype_bytes(t.dtype));
  }

  Layout natural(const ir::Type& t) const {
    if (t.is_scalar()) return Layout::uniform();
    LINAC_INTERNAL_CHECK(t.rank() <= 2, "a tile of rank > 2 passed check_ranks");
    return blocked_for(t);
  }

  /// UserError at the line that made the first tile of rank > 2 that is not fused into a reduction
  /// (in program order): layouts, and everything after them, are for ranks 1 and 2.
  void check_ranks(const ir::Block& b) const {
    for (const auto& op : b.ops) {
      for (const ir::Value* v : op->results)
        if (v->type.is_tile() && v->type.rank() > 2 && !fused_.count(v))
          throw UserError(op->loc, fmt::format("{} makes {}, a tile of rank {}, but the GPU backend holds tiles of "
                                               "rank 1 or 2 (the interpreter runs any rank): a rank-3 tile of "
                                               "elementwise math and broadcasts is fused into a sum, max or min "
                                               "over one of its axes, if that reduction is its only use; else reduce "
                                               "over the third axis with dot, or walk it with for_range and take",
                                               ir::dsl_spelling(*op), v->type.str(), v->type.rank()));
      for (const auto& r : op->regions) check_ranks(*r);
    }
  }

  /// Whether `v` is computed into registers: not index math or a view, which are evaluated in
  /// whatever layout their consumer has (see smem_plan.h).
  bool is_data(const ir::Value* v) {
    if (!v->def || v->type.is_scalar()) return !v->def ? !v->type.is_scalar() : false;
    auto it = is_data_.find(v);
    if (it != is_data_.end()) return it->second;
    bool d = true;
    switch (v->def->code) {
      case OpCode::Constant: case OpCode::Iota: case OpCode::Splat: case OpCode::ExpandDims:
      case OpCode::Broadcast: case OpCode::Reshape: case OpCode::Transpose: case OpCode::Take:
      case OpCode::Slice: case OpCode::Concat: case OpCode::Place:
        d = false;
        break;
      default:
        if (ir::is_elementwise(v->def->code)) {
          d = false;
          for (const ir::Value* o : v->def->operands) d |= is_data(o);
        }
    }
    is_data_[v] = d;
    return d;
  }

  /// A load, or casts of one: its layout can follow its consumer's at no cost (the load reads global
  /// memory at whatever coordinates it is given).
  static bool load_rooted(const ir::Value* v) {
    while (v->def && v->def->code == OpCode::Cast) v = v->def->operands[0];
    return v->def && v->def->code == OpCode::Load;
  }

  /// Whether every tile operand of `op` that holds data is a load or a cast of one.
  bool all_load_rooted(const ir::Op& op) {
    for (const ir::Value* v : op.operands)
      if (!v->type.is_scalar() && is_data(v) && !load_rooted(v)) return false;
    return true;
  }

  /// Records, for elementwise results, that a consumer computes in the mma layout (or that a dot takes
  /// them as its A operand, which it then reads from their registers: smem_plan.h dot_a_in_registers);
  /// and for loads (and their casts) that an elementwise consumer computes in another blocked layout.
  void collect_wants(const ir::Block& b) {
    for (auto it = b.ops.rbegin(); it != b.ops.rend(); ++it) {
      const ir::Op& op = **it;
      for (const auto& r : op.regions) collect_wants(*r);
      if (op.code == OpCode::Dot) {
        // On sm_90a only: there A from registers saves wgmma a store, a barrier and ldmatrix per
        // operand (on sm_80 the layouts stay as they were; see assign_op).
        const ir::Value* a = op.operands[0];
        auto l = out_.find(op.result());
        if (warpgroups_ && a->def && ir::is_elementwise(a->def->code) && Layout::mma_fits(a->type.shape) &&
            l != out_.end() &&
            registers_are_a_fragments(Layout::mma(a->type.shape, num_warps_, warpgroups_), l->second))
          wants_mma_.insert(a);
        continue;
      }
      if (!ir::is_elementwise(op.code) || op.results.empty()) continue;
      const ir::Value* res = op.result();
      auto l = out_.find(res);
      if (l != out_.end() && l->second.kind == Layout::Kind::Blocked) {
        for (const ir::Value* o : op.operands) {
          auto ol = out_.find(o);
          if (ol == out_.end() || ol->second.kind != Layout::Kind::Blocked || ol->second == l->second) continue;
          if (o->type.shape != res->type.shape || !load_rooted(o)) continue;
          for (const ir::Value* v = o;; v = v->def->operands[0]) {
            wants_blocked_.emplace(v, l->second);  // the first consumer's wish wins
            if (v->def->code == OpCode::Load) break;
          }
        }
      }
      bool mma = (l != out_.end() && l->second.kind == Layout::Kind::Mma) || wants_mma_.count(res);
      if (!mma) continue;
      for (const ir::Value* o : op.operands)
        if (o->def && ir::is_elementwise(o->def->code) && o->type.shape == res->type.shape) wants_mma_.insert(o);
    }
  }

  void assign_block(const ir::Block& b) {
    for (const auto& op : b.ops) assign_op(*op);
  }

  void assign_op(const ir::Op& op) {
    switch (op.code) {
      case OpCode::Dot: {
        const ir::Type& t = op.result()->type;
        out_[op.result()] = Layout::mma_fits(t.shape) ? Layout::mma(t.shape, num_warps_, warpgroups_) : natural(t);
        return;
      }
      case OpCode::For: {
        const ir::Block& body = *op.regions[0];
        out_[body.args[0]] = Layout::uniform();
        // First pass: carried values enter with their init's layout; then they take the layout the
        // body yields, and the body is assigned again with that choice.
        for (size_t i = 0; i < op.results.size(); ++i) out_[body.args[i + 1]] = out_.at(op.operands[3 + i]);
        assign_block(body);
        const ir::Op& yield = *body.ops.back();
        bool changed = false;
        for (size_t i = 0; i < op.results.size(); ++i) {
          const Layout& y = out_.at(yield.operands[i]);
          if (!(y == out_.at(body.args[i + 1]))) {
            out_[body.args[i + 1]] = y;
            changed = true;
          }
        }
        if (changed) assign_block(body);
        for (size_t i = 0; i < op.results.size(); ++i) out_[op.results[i]] = out_.at(body.args[i + 1]);
        return;
      }
      case OpCode::If: {
        for (const auto& r : op.regions) assign_block(*r);
        const ir::Op& then_yield = *op.regions[0]->ops.back();
        for (size_t i = 0; i < op.results.size(); ++i) out_[op.results[i]] = out_.at(then_yield.operands[i]);
        return;
      }
      default: break;
    }
    if (op.results.empty()) return;
    const ir::Type& t = op.result()->type;
    if (t.is_scalar()) {
      out_[op.result()] = Layout::uniform();
      return;
    }
    if (fused_.count(op.result())) {
      out_[op.result()] = Layout::fused(t.shape);
      return;
    }
    if (op.code == OpCode::Load) {
      auto w = wants_blocked_.find(op.result());
      out_[op.result()] = w != wants_blocked_.end() && w->second.shape == t.shape ? w->second : natural(t);
      return;
    }
    if (ir::is_elementwise(op.code)) {
      // Elementwise ops keep their operands' layout (mma first: it anchors the dot chains) so that a
      // chain of casts and math never moves data between threads.
      const Layout* chosen = nullptr;
      // Among blocked data operands, computed values win over loaded ones (the loads then follow) and
      // over loop-carried ones (whose layout is whatever the loop's yield has: an accumulator
      // `acc + x` then takes x's layout instead of converting x to the layout acc started in).
      bool chosen_follows = false;
      for (ir::Value* v : op.operands) {
        auto it = out_.find(v);
        if (it == out_.end() || it->second.shape != t.shape) continue;
        if (it->second.kind == Layout::Kind::Mma) {
          chosen = &it->second;
          break;
        }
        const bool follows = load_rooted(v) || (!v->def && v->owner && v->owner->parent &&
                                                v->owner->parent->code == OpCode::For);
        if (it->second.kind == Layout::Kind::Blocked && is_data(v) && (!chosen || (chosen_follows && !follows))) {
          chosen = &it->second;
          chosen_follows = follows;
        }
      }
      // Wanted in the mma layout (a consumer computes there, or a dot reads it as A from registers),
      // a value of loaded operands only is computed there on sm_90a: they are read from their shared
      // copies (on sm_80 it stays with its loads: held in the mma layout such values made
      // gated_delta_rule_bwd_chunk_ut spill 20 bytes instead of 4).
      const bool wanted_mma = wants_mma_.count(op.result()) && Layout::mma_fits(t.shape);
      if (chosen && !(warpgroups_ && wanted_mma && chosen_follows && all_load_rooted(op))) {
        Layout l = *chosen;
        out_[op.result()] = l;
        return;
      }
      if (wanted_mma) {
        out_[op.result()] = Layout::mma(t.shape, num_warps_, warpgroups_);
        return;
      }
    }
    out_[op.result()] = natural(t);
  }

  const ir::Kernel& k_;
  int num_warps_;
  bool warpgroups_;
  std::set<const ir::Value*> fused_;
  LayoutMap out_;
  std::map<const ir::Value*, bool> is_data_;
  std::set<const ir::Value*> wants_mma_;
  std::map<const ir::Value*, Layout> wants_blocked_;
};

}  // namespace

LayoutMap assign_layouts(const ir::Kernel& k, bool warpgroups) { return LayoutAssigner(k, warpgroups).run(); }

std::string print_with_layouts(const ir::Kernel& k, const LayoutMap& layouts, const DotAccumulators* accumulators) {
  return ir::print(k, [&](const ir::Value* v) -> std::string {
    auto it = layouts.find(v);
    if (it == layouts.end() || it->second.kind == Layout::Kind::Uniform) return "";
    std::string s = it->second.str();
    if (accumulators && v->def && accumulators->acc_of_dot.count(v->def)) s += " (accumulates)";
    if (accumulators && v->def && accumulators->dot_of_add.count(v->def)) s += " (accumulated by the dot)";
    return s;
  });
}

}  // namespace linac::passes
