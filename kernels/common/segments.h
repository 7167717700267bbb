// The segment-parallel schedule of a chunked forward, what its ops share: where few (sequence x head)
// walks leave the GPU idle, each sequence is cut in segments walked side by side (each segment's state
// from zero, the states entering the segments combined in order, each segment's outputs from its
// entering state: docs/ops/linear_attn.md, "Segments"). The rule that picks the segment length and
// the tuning key that overrides it.
#pragma once
#include <cstdint>

#include <memory>

#include "kernels/common/config_schema.h"
#include "kernels/common/op_support.h"
#include "kernels/common/segment_combine.h"

namespace linac {

/// `--config segment=L`: rows per segment (0: one walk per sequence).
TuningKey segment_key();

/// The default segment length: where the walks (sequences x heads x V blocks) leave at least half the
/// GPU's SMs idle (few_walks, kernels/common/device_limits.h), about SMs / walks segments per
/// sequence (a program per SM), L the largest power of two from 256 that leaves that many and at least
/// `chunk`; else 0. Dense inputs only (varlen: 0).
int default_segment(const SequenceLayout& seq, int64_t walks, int chunk, const OpOptions& opts);

/// Checks a segment length against the chunk and the inputs (UserError naming `op`) and returns the
/// number of segments per sequence (1: the one-walk schedule).
int64_t segments_per_sequence(const std::string& op, const SequenceLayout& seq, int segment, int chunk);

/// The combine kernel for `cfg`, recorded once per configuration.
std::shared_ptr<ir::Kernel> cached_segment_combine(const SegmentCombineConfig& cfg);

/// Adds the first two steps of the segment-parallel forward to `plan`: the scratch (segment_states,
/// segment_inputs [N, segments, H, K, columns], and segment_decays or segment_transitions [N, segments,
/// H, K, K] as `combine.decay` asks, each named `prefix` + its name) and two launches, the op's `states`
/// walk (one program per (V block, sequence x head, segment), then with transitions one per block of
/// `combine.block_v` of P's K columns; with `scalars`; `renames` binds its parameters to other tensors,
/// e.g. v to a column of ones) and the combine (one per (V block, sequence x head)).
void add_segment_states(OpPlan& plan, const SequenceLayout& seq, int64_t segments, int64_t v_blocks, int64_t columns,
                        const SegmentCombineConfig& combine, std::shared_ptr<ir::Kernel> states,
                        const std::map<std::string, double>& scalars, const std::string& prefix = "",
                        std::map<std::string, std::string> renames = {});
/// Adds the segment-parallel forward to `plan`: add_segment_states over the value columns, then the
/// op's `outputs` walk (one program per (V block, sequence x head, segment), with `scalars`).
void add_segment_schedule(OpPlan& plan, const SequenceLayout& seq, int64_t segments, int64_t v_blocks,
                          const SegmentCombineConfig& combine, std::shared_ptr<ir::Kernel> states,
                          std::shared_ptr<ir::Kernel> outputs, const std::map<std::string, double>& scalars);

}  // namespace linac
