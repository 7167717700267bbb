#include "kernels/common/chunk_gate_sums.h"

#include <fmt/format.h>
#include <algorithm>

#include "kernels/common/sequence_bounds.h"

namespace linac {

using namespace dsl;

ChunkLogDecays GateSums::decays() const {
  ChunkLogDecays d;
  d.b = b;
  d.cuts = cuts;
  d.span_total = span_total;
  d.cut_total = cut_total;
  d.total = where(cut_total > 0.0f, kLogDecayFloor, span_total);
  return d;
}

GateSumTables GateSumTables::declare(KernelBuilder& kb) {
  GateSumTables t;
  t.b = kb.tensor("gate_b", DType::f32, 3);
  t.cuts = kb.tensor("gate_cuts", DType::f32, 3);
  t.totals = kb.tensor("gate_totals", DType::f32, 3);
  return t;
}

GateSums GateSumTables::load(const Tile& chunk, const Tile& i_h, int64_t rows) const {
  return {dsl::load(b, {chunk, i_h, 0}, {kIndex, kIndex, rows}),
          dsl::load(cuts, {chunk, i_h, 0}, {kIndex, kIndex, rows}),
          dsl::load(totals, {chunk, i_h, 0}, {kIndex, kIndex, kIndex}),
          dsl::load(totals, {chunk, i_h, 1}, {kIndex, kIndex, kIndex})};
}

std::shared_ptr<ir::Kernel> build_chunk_gate_sums(int chunk, bool varlen) {
  const int64_t BT = chunk, HB = kGateSumHeads;
  KernelBuilder kb("chunk_gate_sums");
  kb.set_num_warps(4);
  kb.set_num_stages(1);
  Tensor g = kb.tensor("g", DType::f32, 3);
  const ChunkIndexTables index_tables = ChunkIndexTables::declare(kb, varlen);
  const GateSumTables out = GateSumTables::declare(kb);
  // Grid axis 1 runs over (batch row x) head blocks: chunk_bounds takes it as the block's first head.
  Tile H = g.dim(2), head_blocks = (H + (HB - 1)) / HB, i_x = program_id(1);
  Tile first_head = varlen ? i_x * HB : (i_x / head_blocks) * H + (i_x % head_blocks) * HB;
  // g [B, T, H] gives chunk_bounds the sequence length (dim 1) and the heads (dim 2), as q would.
  const ChunkBounds cb = index_tables.bounds(g, program_id(0), first_head, BT);
  // [BT, HB]: the chunk's rows of HB heads, summed down the rows.
  const ChunkLogDecays d = chunk_log_decays(load(g, {cb.b, cb.t0, cb.i_h}, {kIndex, BT, HB}, cb.in_seq));
  store(out.b, {cb.global_chunk, cb.i_h, 0}, {kIndex, HB, BT}, transpose(d.b));
  store(out.cuts, {cb.global_chunk, cb.i_h, 0}, {kIndex, HB, BT}, transpose(d.cuts));
  store(out.totals, {cb.global_chunk, cb.i_h, 0}, {kIndex, HB, kIndex}, d.span_total);
  store(out.totals, {cb.global_chunk, cb.i_h, 1}, {kIndex, HB, kIndex}, d.cut_total);
  return kb.finish();
}

void add_chunk_gate_sums(OpPlan& plan, const SequenceLayout& seq, int chunk) {
  static KernelMemo memo;
  auto kernel =
      memo.get(fmt::format("{}/{}", chunk, seq.varlen), [&] { return build_chunk_gate_sums(chunk, seq.varlen); });
  HostTensor offsets, indices;
  const int64_t chunks = chunk_tables(seq, chunk, &offsets, &indices);
  plan.tensors.try_emplace("chunk_offsets", offsets);
  if (seq.varlen) plan.tensors.try_emplace("chunk_indices", indices);
  const int64_t per_sequence = (seq.T + chunk - 1) / chunk;
  const int64_t rows = std::max<int64_t>(chunks, 1);
  plan.tensors["gate_b"] = HostTensor::zeros(DType::f32, {rows, seq.H, chunk});
  plan.tensors["gate_cuts"] = HostTensor::zeros(DType::f32, {rows, seq.H, chunk});
  plan.tensors["gate_totals"] = HostTensor::zeros(DType::f32, {rows, seq.H, 2});
  const int64_t head_blocks = (seq.H + kGateSumHeads - 1) / kGateSumHeads;
  if (chunks > 0)
    plan.launches.push_back(plan_launch(plan, kernel, {seq.varlen ? chunks : per_sequence,
                                                       seq.varlen ? head_blocks : seq.B * head_blocks, 1}, {}));
}

}  // namespace linac
