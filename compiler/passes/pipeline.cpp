#include "compiler/passes/pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "compiler/passes/layout.h"
#include "linac/error.h"

namespace linac::passes {

using ir::OpCode;

namespace {

/// Tiles of fewer rows stay on cp.async where the kernel's own warps issue the copies: gla's backward
/// walks (chunks of 16, 5 to 7 tiles per step) ran 7% slower with TMA (docs/hopper.md, "TMA"). Producer
/// warps take every ring load through TMA (warp_roles.h), so there the least is a swizzle's 8 rows.
int64_t min_tma_rows(const ir::Kernel& k) { return k.producer_warps ? 8 : 32; }

/// The least columns of a pipelined tile that only TMA can copy (collect).
constexpr int64_t kMinTmaOnlyColumns = 32;

/// The TMA form of pipelined load `op` and its tensor map (TmaLoad::map unset); nullopt where the tile
/// is not a box of its tensor that a swizzled buffer can hold.
std::optional<std::pair<TmaLoad, TensorMapSpec>> tma_form(const ir::Op& op, int64_t min_rows) {
  const ir::Type& t = op.result()->type;
  const ir::Value* tensor = op.operands[0];
  const int rank = tensor->type.rank();
  const std::vector<int64_t>& dims = op.attrs.dims;
  if (t.rank() != 2 || dims.size() != 2 || rank > 5 || dims[0] >= dims[1] || dims[1] != rank - 1) return std::nullopt;
  const int width = swizzle_width(t);
  if (width == 0 || t.shape[0] < min_rows || t.shape[0] > 256) return std::nullopt;
  TensorMapSpec spec{tensor, std::vector<int64_t>(rank, 1), width};
  const int64_t elem = dtype_bytes(t.dtype);
  spec.box[dims[0]] = t.shape[0];
  spec.box[dims[1]] = width / elem;
  TmaLoad l;
  l.box_cols = width / elem;
  l.boxes = static_cast<int>(t.shape[1] / l.box_cols);
  l.bytes = t.numel() * elem;
  return std::pair{l, spec};
}

/// tma_form with its map added to plan.tensor_maps (plan_pipelining).
std::optional<TmaLoad> tma_load(const ir::Op& op, int64_t min_rows, PipelinePlan& plan) {
  auto form = tma_form(op, min_rows);
  if (!form) return std::nullopt;
  auto& [l, spec] = *form;
  auto it = std::find(plan.tensor_maps.begin(), plan.tensor_maps.end(), spec);
  l.map = static_cast<int>(it - plan.tensor_maps.begin());
  if (it == plan.tensor_maps.end()) plan.tensor_maps.push_back(spec);
  return l;
}

/// The loads of every loop's body that a ring can copy an iteration or more ahead, into plan.loads:
/// tiles of tensors the kernel does not write, at coordinates the loop's head can compute. The kernel's
/// threads copy a tile in 16-byte runs (cp.async), so it must split into such runs over all of them.
/// With `tma`, a tile too small for the threads is taken too where TMA copies it, it has at least
/// kMinTmaOnlyColumns columns and the kernel has no producer warps: the delta backward's per-chunk
/// kernel on 8 warps loaded four [32, 32] tiles every value step unpipelined and ran 2.1x slower (H200,
/// docs/hopper.md session 38). Where the launcher cannot describe the tensor to TMA (rows not 16-byte
/// aligned) the copy falls back to the threads element by element, slower than a direct load: the
/// normalized backward's walks pad [B, T, H, 1] columns to [64, 16] tiles, and taken so their dq and
/// dk walks ran 7% slower in fp32 and, with producer warps (one warp copying), 5.6x slower in bf16.
/// Narrower tiles are where kernels pad such columns: they stay direct loads.
void collect(const ir::Kernel& k, const ir::Block& b, const std::set<const ir::Value*>& stored, bool tma,
             PipelinePlan& plan) {
  for (const auto& op : b.ops) {
    for (const auto& r : op->regions) collect(k, *r, stored, tma, plan);
    if (op->code != OpCode::For) continue;
    const ir::Block& body = *op->regions[0];
    for (const auto& inner : body.ops) {
      if (inner->code != OpCode::Load || inner->result()->type.is_scalar()) continue;
      // A tensor the kernel also writes may be written by this very loop: reading it an iteration
      // early would read stale data (e.g. a state kept in global memory and updated in place).
      if (stored.count(inner->operands[0])) continue;
      bool predictable = true;
      for (size_t i = 1; i < inner->operands.size(); ++i) predictable &= is_predictable_scalar(inner->operands[i], body);
      if (!predictable) continue;
      if (splits_into_16_byte_copies(inner->result()->type, k.num_warps * 32) ||
          (tma && !k.producer_warps && inner->result()->type.shape.back() >= kMinTmaOnlyColumns &&
           tma_form(*inner, min_tma_rows(k))))
        plan.loads.insert(inner.get());
    }
  }
}

}  // namespace

int swizzle_width(const ir::Type& t) {
  if (t.rank() != 2 || t.shape[0] % 8 != 0) return 0;
  const int64_t row_bytes = t.shape[1] * dtype_bytes(t.dtype);
  return row_bytes % 128 == 0 ? 128 : row_bytes == 64 ? 64 : row_bytes == 32 ? 32 : 0;
}

bool tma_for_sm(int sm) {
  bool on = true;
  if (const char* w = std::getenv("LINAC_TMA"); w && *w) {
    const std::string s(w);
    if (s == "0") on = false;
    else if (s != "1") throw UserError(fmt::format("LINAC_TMA={}: expected 0 or 1", s));
  }
  return sm >= 90 && on;
}

std::set<const ir::Value*> stored_tensors(const ir::Kernel& k) {
  std::set<const ir::Value*> stored;
  ir::walk(const_cast<ir::Block&>(k.body), [&](ir::Op& op) {
    if (op.code == OpCode::Store) stored.insert(op.operands[0]);
  });
  return stored;
}

bool splits_into_16_byte_copies(const ir::Type& t, int num_threads) {
  if (t.is_scalar()) return false;
  int elem = dtype_bytes(t.dtype);
  if (elem != 2 && elem != 4) return false;
  // cp.async moves 16 bytes: the tile must split into 16-byte runs over all the threads.
  Layout l = Layout::blocked(t.shape, num_threads, elem);
  return l.vec * elem == 16;
}

bool is_predictable_scalar(const ir::Value* v, const ir::Block& body) {
  if (!v->type.is_scalar()) return false;
  if (!ir::defined_in(v, body)) return true;  // loop-invariant
  if (!v->def) return v == body.args[0];  // the induction variable (carried values are not)
  switch (v->def->code) {
    case OpCode::Constant: case OpCode::Dim: case OpCode::ProgramId: case OpCode::NumPrograms:
      return true;
    case OpCode::Add: case OpCode::Sub: case OpCode::Mul: case OpCode::Div: case OpCode::Rem:
    case OpCode::Max: case OpCode::Min: case OpCode::Cast:
      for (const ir::Value* o : v->def->operands)
        if (!is_predictable_scalar(o, body)) return false;
      return true;
    default: return false;
  }
}

PipelinePlan plan_pipelining(const ir::Kernel& k, bool tma) {
  PipelinePlan plan;
  plan.stages = std::clamp(k.num_stages, 1, ir::kMaxNumStages);
  if (plan.stages < 2) return plan;
  collect(k, k.body, stored_tensors(k), tma, plan);
  if (!tma) return plan;
  // In program order, so that the maps' parameter order does not depend on addresses.
  ir::walk(const_cast<ir::Block&>(k.body), [&](ir::Op& op) {
    if (!plan.loads.count(&op)) return;
    if (auto l = tma_load(op, min_tma_rows(k), plan)) plan.tma[&op] = *l;
  });
  plan.producer = plan_producer(k, plan);
  return plan;
}

}  // namespace linac::passes
