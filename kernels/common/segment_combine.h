// The combine step of the segment-parallel forwards (kernels/common/segments.h, docs/ops/linear_attn.md
// "Segments"): the states entering the segments of every sequence, in order, from each segment's own
// state (from zero) and its total log-decay. A kernel in the DSL, shared by linear_attn and gla.
#pragma once
#include <memory>

namespace linac {

namespace ir {
struct Kernel;
}

/// How a segment maps the state entering it, S -> M(S) + T_s: M is the identity, exp(d_s) S with d_s
/// its total log-decay (one per head), diag(exp(d_s)) S (one per key channel), or P_s S with P_s the
/// product of its chunks' [K, K] transition matrices (the delta rules: a matrix per head).
enum class SegmentDecay : uint8_t { none, per_head, per_channel, transition };

struct SegmentCombineConfig {
  int block_k = 64;  // BK >= K
  int block_v = 64;  // BV: value columns per program
  SegmentDecay decay = SegmentDecay::none;
  bool initial_state = false;
  bool final_state = false;
  int num_warps = 4;
};

/// One program per (V block, sequence x head) walks the segments in order: it writes S_s, the state
/// entering segment s, to segment_inputs [N, segments, H, K, V], with S_0 = initial_state (or zeros) and
/// S_{s+1} = decay(d_s) S_s + T_s (T: segment_states [N, segments, H, K, V]; d: segment_decays,
/// [N, segments, H] per head or [N, segments, H, K] per channel), or S_{s+1} = P_s S_s + T_s (P:
/// segment_transitions [N, segments, H, K, K], a product in fp32 FMAs), and the state after the last
/// segment to final_state. Parameters: segment_states [segment_decays | segment_transitions]
/// [initial_state] segment_inputs [final_state].
std::shared_ptr<ir::Kernel> build_segment_combine(const SegmentCombineConfig& cfg);

}  // namespace linac
