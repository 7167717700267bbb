#include "kernels/linear_attn/fwd.h"

#include "kernels/common/chunk_gate_sums.h"
#include "kernels/common/log_decay.h"
#include "kernels/common/prologue.h"
#include "linac/blocks.h"
#include "linac/dsl.h"

namespace linac {

using namespace dsl;

// One program per (V block, sequence x head) walks the chunks of its sequence in order, carrying the
// state S [BK, BV] in registers (the "fused chunk" schedule). Per chunk, with b the chunk-local
// cumulative log-decay (all zeros without a gate):
//   O = scale * ((exp(b) .* Q) S + ((Q K^T) .* exp(b_r - b_c) .* M) V)
//   S = exp(b_C) S + (exp(b_C - b) .* K)^T V
std::shared_ptr<ir::Kernel> build_linear_attn_fwd(const LinearAttnConfig& cfg) {
  const int64_t BT = cfg.chunk, BK = cfg.block_k, BV = cfg.block_v;
  const DType dt = cfg.dtype, f32 = DType::f32;
  const bool states_only = cfg.walk == LinearAttnWalk::segment_states;
  const bool from_segment = cfg.walk == LinearAttnWalk::segment_outputs;
  KernelBuilder kb(states_only ? "linear_attn_segment_states" : "linear_attn_fwd");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(cfg.num_stages);
  kb.set_producer_warps(cfg.producer_warps);
  // One block per SM is enough for ptxas: left to choose, it held the sm_80 form to 128 registers
  // (four blocks) and spilled once its products accumulated in place.
  kb.set_min_ctas_per_sm(1);
  auto [q, k, v] = declare_qkv(kb, dt);
  const GateSumTables gates = cfg.gated ? GateSumTables::declare(kb) : GateSumTables();
  Tensor chunk_offsets = cfg.gated ? kb.tensor("chunk_offsets", DType::i32, 1) : Tensor();
  const bool h0_in = cfg.initial_state && cfg.walk == LinearAttnWalk::sequence;
  const bool ht_out = cfg.final_state && cfg.walk == LinearAttnWalk::sequence;
  Tensor h0 = h0_in ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor ht = ht_out ? kb.tensor("final_state", f32, 4) : Tensor();
  Tensor cu = cfg.varlen ? kb.tensor("cu_seqlens", DType::i32, 1) : Tensor();
  Tensor seg_states = states_only ? kb.tensor("segment_states", f32, 5) : Tensor();
  Tensor seg_decays = states_only && cfg.gated ? kb.tensor("segment_decays", f32, 3) : Tensor();
  Tensor seg_inputs = from_segment ? kb.tensor("segment_inputs", f32, 5) : Tensor();
  Tensor o = states_only ? Tensor() : kb.tensor("o", dt, 4);
  Tile scale = kb.scalar("scale", f32);

  Tile i_v = program_id(0);
  const auto [i_nh, i_n, i_h, seq_rows] = sequence_program(q, cu, cfg.varlen, 1);
  Tile i_s = cfg.walk == LinearAttnWalk::sequence ? Tile() : program_id(2);
  const auto [b, bos, eos] = i_s.valid() ? segment_bounds(seq_rows, i_s, cfg.segment) : seq_rows;
  Tile num_chunks = (eos - bos + (BT - 1)) / BT;
  Tile v0 = i_v * BV;
  // The gates' sums' row of the walk's first chunk (segments are whole chunks).
  Tile first_chunk = cfg.gated ? load(chunk_offsets, {i_n}, {kIndex}) : Tile();
  if (cfg.gated && i_s.valid()) first_chunk = first_chunk + i_s * (cfg.segment / BT);

  Tile S = zeros({BK, BV}, f32);
  if (h0_in) S = load(h0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV});
  if (from_segment) S = load(seg_inputs, {i_n, i_s, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV});
  Tile decay_sum = constant(0.0f, f32);  // the segment's log-decay (segment_states, gated)

  Tile row = expand_dims(iota(BT), 1), col = expand_dims(iota(BT), 0);
  Tile causal = row >= col;
  AccessOptions in_seq{.limits = {{1, eos}}};

  auto body = [&](Tile i) {
    Tile t0 = bos + i * BT;
    // scale is applied to the fp32 products rather than to Q: Q then feeds the tensor cores as loaded.
    Tile Q = states_only ? Tile() : load(q, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile K = load(k, {b, t0, i_h, 0}, {kIndex, BT, kIndex, BK}, in_seq);
    Tile V = load(v, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, in_seq);
    Tile A = states_only ? Tile() : where(causal, dot(Q, K.T()) * scale, 0.0f);
    Tile O;
    if (cfg.gated) {
      // Differences of b, not blocks::chunk_decays' sums of gates: those add a [BT, BT] scan through
      // shared memory to every chunk of this walk (in its PTX about 300 more instructions and 4 or 5
      // more barriers per chunk, more registers and spills). b from the gates' sums (no scan here).
      const ChunkLogDecays dec = gates.load(first_chunk + i, i_h, BT).decays();
      if (!states_only) {
        A = A * dec.between(causal);
        O = dot(Q, S.to(dt)) * (expand_dims(dec.from_start(), 1) * scale);
      }
      // K's decayed copy formed transposed, [BK, BT]: wgmma's A operand from the registers that hold it,
      // K read from its ring stage by ldmatrix.trans (KernelLowering::transpose_by_ldmatrix), instead of
      // scaled in its blocked layout, stored to a padded buffer and read back by ldmatrix.trans.
      Tile K_decayedT = (K.T().to(f32) * expand_dims(dec.to_end(), 0)).to(dt);
      // In place (the decayed state recorded first, the product accumulating into it): one [BK, BV]
      // accumulator, not two. At head dim 256 and 128 value columns ptxas spilled 1352 bytes with the
      // product first and spills 4 in place (sm_90a); elsewhere in place was no slower
      // (docs/ops/linear_attn.md, "Measured").
      S = blocks::state_update_transposed_keys(S, K_decayedT, V, dec.total, /*in_place=*/true);
      if (states_only) decay_sum = decay_sum + dec.total;
    } else {
      if (!states_only) O = dot(Q, S.to(dt)) * scale;
      S = blocks::state_update(S, K, V);
    }
    if (states_only) return;
    O = O + dot(A.to(dt), V);
    store(o, {b, t0, i_h, v0}, {kIndex, BT, kIndex, BV}, O.to(dt), in_seq);
  };
  if (states_only && cfg.gated) {
    for_range(0, num_chunks, body, S, decay_sum);
  } else {
    for_range(0, num_chunks, body, S);
  }

  if (ht_out) store(ht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S);
  if (states_only) {
    store(seg_states, {i_n, i_s, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV}, S);
    if (cfg.gated) {
      // One value per (sequence, segment, head): the first V block stores it, the others are masked.
      AccessOptions first_block{.limits = {{2, i_h + 1 - minimum(i_v, 1)}}};
      store(seg_decays, {i_n, i_s, i_h}, {kIndex, kIndex, 1}, zeros({1}, f32) + decay_sum, first_block);
    }
  }
  return kb.finish();
}

}  // namespace linac
