#include "kernels/common/segment_combine.h"

#include "linac/dsl.h"

namespace linac {

using namespace dsl;

std::shared_ptr<ir::Kernel> build_segment_combine(const SegmentCombineConfig& cfg) {
  const int64_t BK = cfg.block_k, BV = cfg.block_v;
  const DType f32 = DType::f32;
  KernelBuilder kb("segment_combine");
  kb.set_num_warps(cfg.num_warps);
  kb.set_num_stages(1);
  // P S on the tensor cores as three tf32 products (about fp32's precision: compiler/nvptx/lower_dot.cpp);
  // in fp32 FMAs its chain over the segments was slower than a segment's walk (docs/ops/delta_rule.md).
  if (cfg.decay == SegmentDecay::transition) kb.set_tensor_core_f32(true);
  Tensor seg_states = kb.tensor("segment_states", f32, 5);
  Tensor seg_decays;
  if (cfg.decay == SegmentDecay::per_head) seg_decays = kb.tensor("segment_decays", f32, 3);
  if (cfg.decay == SegmentDecay::per_channel) seg_decays = kb.tensor("segment_decays", f32, 4);
  Tensor transitions = cfg.decay == SegmentDecay::transition ? kb.tensor("segment_transitions", f32, 5) : Tensor();
  Tensor h0 = cfg.initial_state ? kb.tensor("initial_state", f32, 4) : Tensor();
  Tensor seg_inputs = kb.tensor("segment_inputs", f32, 5);
  Tensor ht = cfg.final_state ? kb.tensor("final_state", f32, 4) : Tensor();
  Tile i_v = program_id(0), i_nh = program_id(1);
  Tile H = seg_states.dim(2);
  Tile i_n = i_nh / H, i_h = i_nh % H;
  Tile v0 = i_v * BV;
  Tile S = cfg.initial_state ? load(h0, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}) : zeros({BK, BV}, f32);
  for_range(0, seg_states.dim(1), [&](Tile s) {
    store(seg_inputs, {i_n, s, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV}, S);
    Tile T = load(seg_states, {i_n, s, i_h, 0, v0}, {kIndex, kIndex, kIndex, BK, BV});
    switch (cfg.decay) {
      case SegmentDecay::none: S = S + T; break;
      case SegmentDecay::per_head: S = S * exp(load(seg_decays, {i_n, s, i_h}, {kIndex, kIndex, kIndex})) + T; break;
      case SegmentDecay::per_channel:
        S = S * expand_dims(exp(load(seg_decays, {i_n, s, i_h, 0}, {kIndex, kIndex, kIndex, BK})), 1) + T;
        break;
      case SegmentDecay::transition:
        S = dot(load(transitions, {i_n, s, i_h, 0, 0}, {kIndex, kIndex, kIndex, BK, BK}), S) + T;
        break;
    }
  }, S);
  if (cfg.final_state) store(ht, {i_n, i_h, 0, v0}, {kIndex, kIndex, BK, BV}, S);
  return kb.finish();
}

}  // namespace linac
