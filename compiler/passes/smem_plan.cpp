#include "compiler/passes/smem_plan.h"

#include <algorithm>
#include <cstdlib>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <vector>

#include "compiler/ir/printer.h"

namespace linac::passes {

using ir::OpCode;

int64_t scan_2d_scratch_bytes(const ir::Op& op) {
  if (op.code != OpCode::Scan) return 0;
  const auto& x = op.operands[0]->type;
  const DType t = x.dtype;
  const bool acc_32 = t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::i32;
  if (x.rank() != 2 || !acc_32 || x.shape[op.attrs.axis] > 128) return 0;
  return x.shape[0] * x.shape[1] * 4;
}

namespace {

/// Ops whose result is read through their tile operands wherever it is used. Most have one tile
/// operand (take's index is a scalar); concat and place choose, per element, which operand to read.
bool is_view(OpCode c) {
  return c == OpCode::ExpandDims || c == OpCode::Broadcast || c == OpCode::Reshape || c == OpCode::Transpose ||
         c == OpCode::Take || c == OpCode::Slice || c == OpCode::Concat || c == OpCode::Place;
}

class Planner {
 public:
  Planner(const ir::Kernel& k, const LayoutMap& layouts, const PipelinePlan& pipeline, int64_t max_smem_bytes,
          DotUnit unit)
      : k_(k), layouts_(layouts), max_smem_bytes_(max_smem_bytes), unit_(unit) {
    plan_.pipeline = pipeline;
  }

  SmemPlan run() {
    for (const auto& p : k_.params)
      if (!p.value->type.is_tensor()) plan_.classes[p.value] = ValueClass::Scalar;
    classify_block(k_.body);
    number_block(k_.body);
    mark_block(k_.body);
    for (const ir::Op* load : plan_.pipeline.loads) spilled_.insert(load->result());
    // A TMA copy writes its box's rows in the swizzled layout (pipeline.h).
    for (const auto& [load, tma] : plan_.pipeline.tma) swizzled_[load->result()] = swizzle_width(load->result()->type);
    choose_prefetched_loads();
    if (unit_ != DotUnit::mma_sync) ir::walk(const_cast<ir::Block&>(k_.body), [&](ir::Op& op) { choose_wgmma(op); });
    ir::walk(const_cast<ir::Block&>(k_.body), [&](ir::Op& op) {
      if (op.code != OpCode::Dot || plan_.wgmma_dots.count(&op) || plan_.dots_a_in_registers.count(&op)) return;
      if (const int slices = dot_split_k(op, layout(op.result()), k_.num_warps, k_.tensor_core_f32); slices > 1)
        plan_.split_dots[&op] = slices;
    });
    allocate();
    return std::move(plan_);
  }

 private:
  // ---- classification ----
  void classify_block(const ir::Block& b) {
    for (const auto& op : b.ops) {
      for (const auto& r : op->regions) {
        for (const ir::Value* a : r->args) plan_.classes[a] = a->type.is_scalar() ? ValueClass::Scalar : ValueClass::Data;
        classify_block(*r);
      }
      for (const ir::Value* v : op->results) plan_.classes[v] = classify(*op, *v);
    }
  }

  ValueClass classify(const ir::Op& op, const ir::Value& v) const {
    if (v.type.is_scalar()) return ValueClass::Scalar;
    // A rank-3 tile fused into its reductions is evaluated there, from its sources (layout.h).
    if (layout(&v).kind == Layout::Kind::Fused) return is_view(op.code) ? ValueClass::View : ValueClass::Remat;
    if (op.code == OpCode::For || op.code == OpCode::If) return ValueClass::Data;
    switch (op.code) {
      case OpCode::Constant: case OpCode::Iota: case OpCode::Splat: return ValueClass::Remat;
      default: break;
    }
    if (is_view(op.code)) {
      bool all_remat = true;
      for (const ir::Value* o : op.operands)
        if (!o->type.is_scalar()) all_remat &= plan_.classes.at(o) == ValueClass::Remat;
      return all_remat ? ValueClass::Remat : ValueClass::View;
    }
    if (ir::is_elementwise(op.code)) {
      // Math on index math and views (no operand computed into registers) is evaluated where it is
      // used, as the layout pass assumes (it gives such values no layout of their own to convert from):
      // a cast of a slice multiplied with a data tile reads the slice's source at the data tile's
      // coordinates, with no copy of the cast through shared memory.
      bool any_data = false;
      for (const ir::Value* o : op.operands) any_data |= plan_.classes.at(o) == ValueClass::Data;
      return any_data ? ValueClass::Data : ValueClass::Remat;
    }
    return ValueClass::Data;
  }

  // ---- program order ----
  void number_block(const ir::Block& b) {
    for (const ir::Value* a : b.args) def_index_[a] = counter_;
    for (const auto& op : b.ops) {
      start_[op.get()] = counter_++;
      for (const auto& r : op->regions) number_block(*r);
      end_[op.get()] = counter_++;
      for (const ir::Value* v : op->results) def_index_[v] = end_[op.get()];
    }
  }

  // ---- which values are read from shared memory ----
  void mark_block(const ir::Block& b) {
    for (const auto& op : b.ops) {
      mark_op(*op);
      for (const auto& r : op->regions) mark_block(*r);
    }
  }

  const Layout& layout(const ir::Value* v) const { return layouts_.at(v); }
  ValueClass cls(const ir::Value* v) const { return plan_.classes.at(v); }

  void need_smem(const ir::Value* v) {
    if (cls(v) == ValueClass::View || cls(v) == ValueClass::Remat) {
      // A view, or math on views, consumed as a whole (dot operand, reduction) is materialized from
      // its sources.
      for (const ir::Value* o : v->def->operands) need_eval(o);
    }
    spilled_.insert(v);
  }

  /// `v` is read at coordinates of another layout: data leaves must be in shared memory.
  void need_eval(const ir::Value* v) {
    switch (cls(v)) {
      case ValueClass::Scalar: return;
      case ValueClass::Data: spilled_.insert(v); return;
      case ValueClass::View:
      case ValueClass::Remat:
        for (const ir::Value* o : v->def->operands) need_eval(o);
        return;
    }
  }

  /// `v` is read in registers of layout `want`.
  void need_in_layout(const ir::Value* v, const Layout& want) {
    if (v->type.is_scalar()) return;
    if (cls(v) == ValueClass::Data && layout(v) == want) return;
    need_eval(v);
  }

  void note_use(const ir::Value* v, const ir::Op& op) {
    uses_[v].push_back(&op);
    if (!v->type.is_tensor() && (cls(v) == ValueClass::View || cls(v) == ValueClass::Remat))
      for (const ir::Value* o : v->def->operands) note_use(o, op);
  }

  void mark_op(const ir::Op& op) {
    // A view (expand_dims, broadcast, reshape, transpose, take, slice, concat, place), and math on views
    // and index math, reads its sources wherever it is used, so a use of it is a use of every value down
    // its chains: the sources' buffers must stay live (regression: tests/python/test_smem_plan.py, a view
    // made early and used late).
    for (const ir::Value* v : op.operands) note_use(v, op);
    switch (op.code) {
      case OpCode::Dot:
        for (const ir::Value* v : op.operands) {
          if (v == op.operands[0] && dot_a_in_registers(op, layouts_, plan_.classes)) {
            plan_.dots_a_in_registers.insert(&op);
            // Math on views is evaluated at the fragments' coordinates, from its sources' copies.
            if (cls(v) == ValueClass::Remat) need_eval(v);
            continue;
          }
          if (auto in_place = dot_operand_in_place(v, plan_.classes))
            need_smem(in_place->buf);  // read at an offset, or transposed with ldmatrix.trans
          else
            need_smem(v);
        }
        return;
      case OpCode::Reduce:
        if (layout(op.operands[0]).kind == Layout::Kind::Fused)
          need_eval(op.operands[0]);  // its data leaves, read at each step of the reduction
        else if (register_reduction(op, layout(op.operands[0]), cls(op.operands[0]) == ValueClass::Data))
          need_in_layout(op.operands[0], layout(op.operands[0]));  // evaluated there where not held
        else
          need_smem(op.operands[0]);
        return;
      case OpCode::Scan: need_smem(op.operands[0]); return;
      case OpCode::Take:  // a tile's take is a view (read where it is used); a scalar one reads now
        if (op.result()->type.is_scalar()) need_eval(op.operands[0]);
        return;
      case OpCode::Store: need_in_layout(op.operands.back(), layout_for_store(op.operands.back())); return;
      case OpCode::Load:
        if (op.attrs.prefetch) need_smem(op.result());
        break;
      case OpCode::For: {
        const ir::Block& body = *op.regions[0];
        for (size_t i = 0; i < op.results.size(); ++i) need_in_layout(op.operands[3 + i], layout(body.args[i + 1]));
        const ir::Op& yield = *body.ops.back();
        for (size_t i = 0; i < op.results.size(); ++i) need_in_layout(yield.operands[i], layout(body.args[i + 1]));
        return;
      }
      case OpCode::If:
        for (const auto& r : op.regions) {
          const ir::Op& yield = *r->ops.back();
          for (size_t i = 0; i < op.results.size(); ++i) need_in_layout(yield.operands[i], layout(op.results[i]));
        }
        return;
      default: break;
    }
    if (op.results.empty() || op.result()->type.is_scalar()) return;
    if (cls(op.result()) == ValueClass::Data && ir::is_elementwise(op.code))
      for (const ir::Value* v : op.operands) need_in_layout(v, layout(op.result()));
  }

  Layout layout_for_store(const ir::Value* v) const {
    return store_layout(v, layout(v), cls(v) == ValueClass::Data, k_.num_warps);
  }

  // ---- prefetched loads (pipeline.h) ----
  /// Top-level loads whose tile goes to shared memory anyway: their copies can be asynchronous at no
  /// cost in shared memory (the buffer and its live range are the same) and with fewer registers. The
  /// others that could be copies are recorded as register loads (printed by print_smem_plan).
  void choose_prefetched_loads() {
    const std::set<const ir::Value*> stored = stored_tensors(k_);
    for (const auto& op : k_.body.ops) {
      if (op->code != OpCode::Load || op->result()->type.is_scalar()) continue;
      if (stored.count(op->operands[0])) continue;  // may be written by this program before the read
      if (!splits_into_16_byte_copies(op->result()->type, k_.num_warps * 32)) continue;
      if (spilled_.count(op->result()))
        plan_.pipeline.prefetched.insert(op.get());
      else
        plan_.register_loads.push_back(op.get());
    }
  }

  // ---- dots on warpgroup tensor cores (sm_90a) ----
  /// Where a dot operand lies, as read (its own buffer, or in place in another's; as stored, [rows]
  /// [cols] of that buffer): {buffer, stored transposed, row0, col0}.
  std::optional<DotOperandInPlace> operand_source(const ir::Value* v) const {
    if (spilled_.count(v)) return DotOperandInPlace{v, false, 0, 0};
    return dot_operand_in_place(v, plan_.classes);
  }

  /// The operand `v` of a wgmma dot read from a swizzled buffer, or nullopt where its buffer cannot
  /// take a swizzled layout that the descriptor steps can address. `mn` is the operand's extent along
  /// M or N per warpgroup instruction (64 for A); `a`: the first operand (stored [m][k] is K-major),
  /// else B (stored [k][n] is MN-major). The steps start on 8-row boundaries and, along the
  /// contiguous dimension, on 16 elements (K-major) or whole swizzle blocks (MN-major).
  std::optional<WgmmaOperand> wgmma_operand(const ir::Value* v, DType in, int64_t mn, bool a) const {
    auto src = operand_source(v);
    if (!src) return std::nullopt;
    WgmmaOperand o{src->buf, a ? !src->transposed : src->transposed, src->row0, src->col0};
    const int width = swizzle_width(o.buf->type);
    if (width == 0 || o.buf->type.dtype != in) return std::nullopt;
    const int64_t block_cols = width / dtype_bytes(in);
    const bool fits = o.k_major ? o.row0 % 8 == 0 && o.col0 % 16 == 0
                                : o.row0 % 8 == 0 && o.col0 % block_cols == 0 && mn % block_cols == 0;
    if (!fits) return std::nullopt;
    return o;
  }

  /// Records `op` as a WgmmaDot when it can be one: 16-bit operands, a result in an mma layout placed
  /// as warpgroups (wm a multiple of 4, no replicated warps), at most 256 columns per warpgroup, and a
  /// B operand in a buffer that can be swizzled (wgmma_operand); A is read so too where it can be, with
  /// DotUnit::wgmma_a_shared.
  void choose_wgmma(const ir::Op& op) {
    if (op.code != OpCode::Dot) return;
    const ir::Value *a = op.operands[0], *b = op.operands[1];
    const DType in = a->type.dtype;
    if ((in != DType::bf16 && in != DType::f16) || b->type.dtype != in) return;
    const Layout& l = layout(op.result());
    if (l.kind != Layout::Kind::Mma || !l.warpgroups || l.wm % 4 != 0 || l.wm * l.wn != k_.num_warps) return;
    const int64_t K = a->type.shape[1], N = b->type.shape[1], n_wg = N / l.wn;
    if (K % 16 != 0 || n_wg % 8 != 0 || n_wg > 256) return;
    auto b_src = wgmma_operand(b, in, n_wg, false);
    if (!b_src) return;
    WgmmaDot d;
    d.b = *b_src;
    if (unit_ == DotUnit::wgmma_a_shared)
      if (auto a_src = wgmma_operand(a, in, 64, true)) d.a = *a_src;
    for (const WgmmaOperand* o : {&d.a, &d.b})
      if (o->buf) swizzled_[o->buf] = swizzle_width(o->buf->type);
    plan_.wgmma_dots[&op] = d;
  }

  // ---- allocation by liveness ----
  int64_t last_use(const ir::Value* v) const {
    int64_t last = def_index_.at(v);
    auto it = uses_.find(v);
    if (it == uses_.end()) return last;
    for (const ir::Op* use : it->second) {
      last = std::max(last, start_.at(use));
      // A use inside a loop that does not contain the definition keeps the value live for the whole loop.
      for (const ir::Block* b = use->parent; b && b->parent; b = b->parent->parent) {
        const ir::Op* region_op = b->parent;
        if (region_op->code == OpCode::For && !(start_.at(region_op) < def_index_.at(v) && def_index_.at(v) <= end_.at(region_op)))
          last = std::max(last, end_.at(region_op));
      }
    }
    return last;
  }

  void allocate() {
    struct Interval {
      const ir::Value* v;
      int64_t begin, end, bytes;
    };
    std::vector<Interval> intervals;
    for (const ir::Value* v : spilled_) {
      SmemBuffer buf;
      buf.dtype = v->type.dtype;
      int elem = dtype_bytes(buf.dtype);
      const auto& s = v->type.shape;
      if (auto sw = swizzled_.find(v); sw != swizzled_.end()) {
        buf.swizzle_bytes = sw->second;
        buf.row_stride = s[1];
        buf.bytes = s[0] * s[1] * elem;  // whole 8-row groups of whole blocks: a multiple of 1024 at 128
      } else if (s.size() == 2) {
        buf.row_stride = s[1] + std::max(1, 16 / elem);  // pad rows by 16 bytes
        buf.bytes = s[0] * buf.row_stride * elem;
      } else {
        buf.bytes = s[0] * elem;
      }
      buf.bytes = (buf.bytes + 15) / 16 * 16;
      buf.stage_bytes = buf.bytes;
      int64_t begin = def_index_.at(v), end = last_use(v);
      if (plan_.pipeline.loads.count(v->def)) {
        // Copies for the next iteration are in flight during the whole loop (and one is issued
        // before it): the buffer is live from the loop's start to its end, with one stage each.
        buf.stages = plan_.pipeline.stages;
        buf.bytes *= buf.stages;
        const ir::Op* loop = v->def->parent->parent;
        begin = start_.at(loop);
        end = end_.at(loop);
      }
      plan_.buffers[v] = buf;
      intervals.push_back({v, begin, end, buf.bytes});
    }
    // Deterministic order: by definition point, then by value id.
    std::sort(intervals.begin(), intervals.end(), [](const Interval& a, const Interval& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.v->id < b.v->id;
    });
    std::vector<Interval> placed;
    std::map<const ir::Value*, int64_t> offsets;
    int64_t total = 0;
    for (const auto& iv : intervals) {
      // First fit among offsets that do not collide with a live, overlapping buffer.
      std::vector<std::pair<int64_t, int64_t>> busy;
      for (const auto& p : placed)
        if (!(p.end < iv.begin || iv.end < p.begin)) busy.push_back({offsets[p.v], offsets[p.v] + p.bytes});
      std::sort(busy.begin(), busy.end());
      // Swizzled buffers start on the swizzle's period (1024 bytes), so that its address bits are the
      // buffer's own offset bits.
      const int64_t align = plan_.buffers[iv.v].swizzle_bytes ? 1024 : 16;
      auto aligned = [&](int64_t x) { return (x + align - 1) / align * align; };
      int64_t off = 0;
      for (auto [lo, hi] : busy) {
        if (aligned(off) + iv.bytes <= lo) break;
        off = std::max(off, hi);
      }
      off = aligned(off);
      offsets[iv.v] = off;
      plan_.buffers[iv.v].offset = off;
      total = std::max(total, off + iv.bytes);
      placed.push_back(iv);
    }
    int64_t max_1d = 0, partials = 0;  // per-warp partials through scratch: register reductions', split dots'
    ir::walk(const_cast<ir::Block&>(k_.body), [&](ir::Op& op) {
      if ((op.code == OpCode::Reduce || op.code == OpCode::Scan) && op.operands[0]->type.rank() == 1)
        max_1d = std::max(max_1d, op.operands[0]->type.shape[0]);
      if (op.code == OpCode::Reduce)
        if (auto rr = register_reduction(op, layout(op.operands[0]), cls(op.operands[0]) == ValueClass::Data))
          partials = std::max(partials, rr->scratch_bytes());
    });
    int64_t scan_2d = 0;
    ir::walk(const_cast<ir::Block&>(k_.body), [&](ir::Op& op) { scan_2d = std::max(scan_2d, scan_2d_scratch_bytes(op)); });
    plan_.scratch_offset = (total + 15) / 16 * 16;
    for (const auto& [dot, slices] : plan_.split_dots)
      partials = std::max(partials, split_dot_scratch_bytes(layout(dot->result()), slices));
    const int64_t scratch_1d = std::max(max_1d ? 32 * 8 + max_1d * 8 : 0, partials);
    plan_.line_scans = scan_2d > 0 && plan_.scratch_offset + std::max(scratch_1d, scan_2d) <= max_smem_bytes_;
    plan_.scratch_bytes = plan_.line_scans ? std::max(scratch_1d, scan_2d) : scratch_1d;
    plan_.total_bytes = plan_.scratch_offset + plan_.scratch_bytes;
    // The TMA rings' mbarriers: after everything else, so that no buffer ever overlaps a barrier that a
    // copy in flight may still complete on.
    ir::walk(const_cast<ir::Block&>(k_.body), [&](ir::Op& op) {
      if (op.code != OpCode::For) return;
      for (const auto& inner : op.regions[0]->ops)
        if (plan_.pipeline.tma.count(inner.get())) {
          plan_.total_bytes = (plan_.total_bytes + 7) / 8 * 8;
          plan_.ring_barriers[&op] = plan_.total_bytes;
          plan_.total_bytes += 8 * plan_.pipeline.stages * plan_.pipeline.barriers_per_stage();
          return;
        }
    });
  }

  const ir::Kernel& k_;
  const LayoutMap& layouts_;
  const int64_t max_smem_bytes_;
  const DotUnit unit_;
  SmemPlan plan_;
  std::map<const ir::Value*, int> swizzled_;  // buffers in a wgmma layout: their swizzle width
  std::set<const ir::Value*> spilled_;
  std::map<const ir::Value*, std::vector<const ir::Op*>> uses_;
  std::map<const ir::Op*, int64_t> start_, end_;
  std::map<const ir::Value*, int64_t> def_index_;
  int64_t counter_ = 0;
};

}  // namespace

std::optional<DotOperandInPlace> dot_operand_in_place(const ir::Value* v,
                                                      const std::map<const ir::Value*, ValueClass>& classes) {
  // Walks down the views keeping "element (i, j) of v is element f(i, j) of u", f as in the result.
  DotOperandInPlace r;
  const ir::Value* u = v;
  while (u->def && classes.at(u) == ValueClass::View && u->type.rank() == 2) {
    const ir::Op& op = *u->def;
    if (op.code == OpCode::Slice) {
      if (op.operands.size() > 1) return std::nullopt;  // a start known at run time
      r.row0 += op.attrs.offsets[0];
      r.col0 += op.attrs.offsets[1];
    } else if (op.code == OpCode::Transpose) {
      r.transposed = !r.transposed;
      std::swap(r.row0, r.col0);
    } else {
      return std::nullopt;
    }
    u = op.operands[0];
  }
  if (u == v || u->type.rank() != 2 || classes.at(u) != ValueClass::Data) return std::nullopt;
  if (r.col0 * dtype_bytes(u->type.dtype) % 16 != 0) return std::nullopt;
  r.buf = u;
  return r;
}

bool dot_a_in_registers(const ir::Op& op, const LayoutMap& layouts, const std::map<const ir::Value*, ValueClass>& classes) {
  if (op.code != OpCode::Dot) return false;
  const ir::Value* a = op.operands[0];
  if (a->type.dtype != DType::bf16 && a->type.dtype != DType::f16) return false;
  if (op.operands[1]->type.dtype != a->type.dtype || a->type.shape[1] % 16 != 0) return false;
  if (classes.at(a) != ValueClass::Data && classes.at(a) != ValueClass::Remat) return false;
  return registers_are_a_fragments(layouts.at(a), layouts.at(op.result()));
}

SmemPlan plan_shared_memory(const ir::Kernel& k, const LayoutMap& layouts, const PipelinePlan& pipeline,
                            int64_t max_smem_bytes, DotUnit unit) {
  return Planner(k, layouts, pipeline, max_smem_bytes, unit).run();
}

std::string print_smem_plan(const ir::Kernel& k, const SmemPlan& plan) {
  auto names = ir::value_names(k);
  auto tma_copy = [&](const ir::Value* v) -> std::string {
    auto t = v->def ? plan.pipeline.tma.find(v->def) : plan.pipeline.tma.end();
    if (t == plan.pipeline.tma.end()) return "";
    const TensorMapSpec& m = plan.pipeline.tensor_maps.at(t->second.map);
    return fmt::format(" by TMA ({} x box [{}] of map {})", t->second.boxes, fmt::join(m.box, ", "), t->second.map);
  };
  std::vector<std::pair<int64_t, std::string>> lines;
  for (const auto& [v, buf] : plan.buffers)
    lines.push_back({buf.offset, fmt::format("smem {:>6} +{:<6} {} {}{}{}{}", buf.offset, buf.bytes, names.at(v),
                                             v->type.str(), buf.row_stride ? fmt::format(" row_stride={}", buf.row_stride) : "",
                                             buf.swizzle_bytes ? fmt::format(" swizzle={}B", buf.swizzle_bytes) : "",
                                             buf.stages > 1                      ? fmt::format(" pipelined stages={}{}", buf.stages, tma_copy(v))
                                             : plan.pipeline.is_prefetched(v) ? std::string(" prefetched")
                                                                               : std::string())});
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (auto& [off, line] : lines) out += line + "\n";
  if (plan.scratch_bytes)
    out += fmt::format("smem {:>6} +{:<6} scratch (reductions and scans{})\n", plan.scratch_offset, plan.scratch_bytes,
                       plan.line_scans ? ", 2-D scans line by line" : "");
  for (const auto& [loop, offset] : plan.ring_barriers)
    out += fmt::format("smem {:>6} +{:<6} mbarriers of the TMA ring of {}, {}\n", offset,
                       8 * plan.pipeline.stages * plan.pipeline.barriers_per_stage(), names.at(loop->regions[0]->args[0]),
                       plan.pipeline.producer.loop == loop
                           ? fmt::format("full and empty per stage: filled by {} producer warps", k.producer_warps)
                           : std::string("one per stage"));
  for (size_t i = 0; i < plan.pipeline.tensor_maps.size(); ++i) {
    const TensorMapSpec& m = plan.pipeline.tensor_maps[i];
    out += fmt::format("tensor map {}: {} box [{}] swizzle={}B\n", i, names.at(m.tensor), fmt::join(m.box, ", "),
                       m.swizzle_bytes);
  }
  // The dots on wgmma, in program order: where each reads its operands.
  std::vector<std::pair<int64_t, std::string>> dots;
  auto where = [&](const WgmmaOperand& o) {
    return fmt::format("{} {}-major at [{}, {}]", names.at(o.buf), o.k_major ? "K" : "MN", o.row0, o.col0);
  };
  auto a_registers = [&](const ir::Op* op) {
    return std::string(plan.dots_a_in_registers.count(op) ? "in its registers" : "by ldmatrix");
  };
  for (const auto& [op, d] : plan.wgmma_dots)
    dots.push_back({op->result()->id, fmt::format("wgmma {} = dot: A {}, B {}{}\n", names.at(op->result()),
                                                  d.a.buf ? where(d.a) : a_registers(op), where(d.b),
                                                  plan.deferred_waits.count(op)    ? ", waited for an iteration later"
                                                  : plan.first_use_waits.count(op) ? ", waited for at its first use"
                                                                                   : "")});
  for (const ir::Op* op : plan.dots_a_in_registers)  // the mma.sync dots'
    if (!plan.wgmma_dots.count(op))
      dots.push_back({op->result()->id, fmt::format("dot {}: A in its registers\n", names.at(op->result()))});
  for (const auto& [op, slices] : plan.split_dots)
    dots.push_back({op->result()->id, fmt::format("dot {}: K in {} slices over its copies' warps, partials through scratch\n",
                                                  names.at(op->result()), slices)});
  std::sort(dots.begin(), dots.end());
  for (auto& [id, line] : dots) out += line;
  // (tests/python/test_prefetched_loads.py reads these lines.)
  for (const ir::Op* op : plan.register_loads)
    out += fmt::format("register load {} {}: no shared copy, waited for at its first use\n", names.at(op->result()),
                       op->result()->type.str());
  out += fmt::format("smem total {} bytes\n", plan.total_bytes);
  return out;
}

int dot_split_k(const ir::Op& op, const Layout& result, int num_warps, bool tensor_core_f32) {
  if (op.code != OpCode::Dot || result.kind != Layout::Kind::Mma) return 1;
  const DType in = op.operands[0]->type.dtype;
  const int64_t K = op.operands[0]->type.shape[1];
  const int64_t depth = in == DType::bf16 || in == DType::f16 ? 16 : in == DType::f32 && tensor_core_f32 ? 8 : 0;
  if (depth == 0 || K % depth != 0) return 1;  // the FMA loop: each thread its own elements, no copies to share
  const int64_t steps = K / depth;
  const int copies = num_warps / (result.wm * result.wn);
  int slices = 1;
  while (slices * 2 <= copies && copies % (slices * 2) == 0 && steps % (slices * 2) == 0 &&
         steps / (slices * 2) >= kMinSplitSteps)
    slices *= 2;
  return slices;
}

int64_t split_dot_scratch_bytes(const Layout& result, int slices) {
  return int64_t{slices} * result.wm * result.wn * 32 * result.regs_per_thread() * 4;
}

DotUnit dot_unit_for_sm(int sm) {
  DotUnit sm90 = DotUnit::wgmma;
  if (const char* w = std::getenv("LINAC_WGMMA"); w && *w) {
    const std::string s(w);
    if (s == "0") sm90 = DotUnit::mma_sync;
    else if (s == "a-shared") sm90 = DotUnit::wgmma_a_shared;
    else if (s != "1") throw UserError(fmt::format("LINAC_WGMMA={}: expected 0, 1 or a-shared", s));
  }
  return sm >= 90 ? sm90 : DotUnit::mma_sync;
}

}  // namespace linac::passes
