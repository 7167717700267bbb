#include "kernels/common/segments.h"

#include <algorithm>
#include <fmt/format.h>

#include "kernels/common/config_schema.h"
#include "kernels/common/device_limits.h"
#include "linac/error.h"

namespace linac {

TuningKey segment_key() {
  return {"segment",
          {0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384},
          "rows per segment of the segment-parallel forward (0: one walk per sequence; default from the GPU's "
          "SM count, docs/ops/linear_attn.md)"};
}

// With one walk per SM two segments each were slower than one walk; at few walks, twice as many
// segments as SMs / walks were slower than that many (docs/ops/linear_attn.md, "Segments").
int default_segment(const SequenceLayout& seq, int64_t walks, int chunk, const OpOptions& opts) {
  if (seq.varlen || !few_walks(walks, opts)) return 0;
  const int64_t sms = device_limits(opts).sms;
  const int64_t segments = sms / std::max<int64_t>(walks, 1);
  const int64_t rows = (seq.T + segments - 1) / segments;
  int segment = 256;  // the smallest key value; the largest that leaves at least `segments` segments
  while (segment * 2 <= rows) segment *= 2;
  return segment >= chunk && segment < seq.T ? segment : 0;
}

int64_t segments_per_sequence(const std::string& op, const SequenceLayout& seq, int segment, int chunk) {
  if (segment % chunk != 0)
    throw UserError(fmt::format("{}: --config segment={} must be a multiple of the chunk ({} rows)", op, segment, chunk));
  if (segment > 0 && seq.varlen)
    throw UserError(fmt::format("{}: --config segment takes dense inputs (the segment-parallel forward does not take "
                                "cu_seqlens yet)", op));
  return segment > 0 ? std::max<int64_t>(1, (seq.T + segment - 1) / segment) : 1;
}

std::shared_ptr<ir::Kernel> cached_segment_combine(const SegmentCombineConfig& cfg) {
  using C = SegmentCombineConfig;
  // Every field specializes the kernel (no tuning keys: the ops set them); the schema keys them all.
  static const ConfigSchema<C> schema(field<&C::block_k>(), field<&C::block_v>(), field<&C::decay>(),
                                      field<&C::initial_state>(), field<&C::final_state>(), field<&C::num_warps>());
  static KernelMemo memo;
  return memo.get(schema.key(cfg), [&] { return build_segment_combine(cfg); });
}

void add_segment_states(OpPlan& plan, const SequenceLayout& seq, int64_t segments, int64_t v_blocks, int64_t columns,
                        const SegmentCombineConfig& combine, std::shared_ptr<ir::Kernel> states,
                        const std::map<std::string, double>& scalars, const std::string& prefix,
                        std::map<std::string, std::string> renames) {
  for (const char* name : {"segment_states", "segment_inputs", "segment_decays", "segment_transitions"})
    renames[name] = prefix + name;
  plan.tensors[prefix + "segment_states"] = HostTensor::zeros(DType::f32, {seq.N, segments, seq.H, seq.K, columns});
  plan.tensors[prefix + "segment_inputs"] = HostTensor::zeros(DType::f32, {seq.N, segments, seq.H, seq.K, columns});
  if (combine.decay == SegmentDecay::per_head)
    plan.tensors[prefix + "segment_decays"] = HostTensor::zeros(DType::f32, {seq.N, segments, seq.H});
  if (combine.decay == SegmentDecay::per_channel)
    plan.tensors[prefix + "segment_decays"] = HostTensor::zeros(DType::f32, {seq.N, segments, seq.H, seq.K});
  int64_t state_blocks = v_blocks;
  if (combine.decay == SegmentDecay::transition) {
    plan.tensors[prefix + "segment_transitions"] =
        HostTensor::zeros(DType::f32, {seq.N, segments, seq.H, seq.K, seq.K});
    state_blocks += (seq.K + combine.block_v - 1) / combine.block_v;
  }
  plan.launches.push_back(
      plan_launch(plan, std::move(states), {state_blocks, seq.N * seq.H, segments}, scalars, renames));
  plan.launches.push_back(
      plan_launch(plan, cached_segment_combine(combine), {v_blocks, seq.N * seq.H, 1}, {}, renames));
}

void add_segment_schedule(OpPlan& plan, const SequenceLayout& seq, int64_t segments, int64_t v_blocks,
                          const SegmentCombineConfig& combine, std::shared_ptr<ir::Kernel> states,
                          std::shared_ptr<ir::Kernel> outputs, const std::map<std::string, double>& scalars) {
  add_segment_states(plan, seq, segments, v_blocks, seq.V, combine, std::move(states), scalars);
  plan.launches.push_back(plan_launch(plan, std::move(outputs), {v_blocks, seq.N * seq.H, segments}, scalars));
}

}  // namespace linac
