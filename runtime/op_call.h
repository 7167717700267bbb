// Op calls on tensors the caller owns (linac/ops.h): the one execution path of every door (the C++ API,
// the C ABI, Python, the CLI).
//
// A call is keyed by op, options, memory space, the dtypes and shapes of its tensors and, for varlen,
// the values of cu_seqlens. The first call at a key prepares it: the op plans its launches on shape-only
// inputs (HostTensor without data), and every plan tensor is given a home:
//   input      the caller's input of the same name, used in place;
//   converted  the caller's input in another dtype than the kernels read, converted into scratch by a
//              launch put before the op's own;
//   output     the caller's output;
//   constant   tables the plan computed on the host (chunk indices, cu_seqlens in int32, ...), uploaded
//              once and kept with the prepared call;
//   scratch    everything else, in one workspace from the caller's allocator. Its contents are whatever
//              the allocator gives (no kernel may read scratch it did not write: the CPU path fills it
//              with NaN so that the tests catch one that does).
// Later calls at the key only bind pointers and queue the launches.
#pragma once
#include "kernels/op.h"
#include "linac/ops.h"

namespace linac {

/// Runs `op` on host tensors through linac/ops.h: on the CPU interpreter, or with opts.device == cuda,
/// inputs uploaded, the call run on the GPU and the outputs downloaded (the CLI's `run`, tools). q, k, v
/// and do are cast to opts.dtype first. Returns the wanted outputs.
TensorMap run_op(const OpDef& op, const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted);

/// For opts.device == cuda, the limits of the current device that ops' defaults may read
/// (OpOptions::max_smem_per_block, num_sms, sm); nothing for the CPU.
void set_device_limits(OpOptions& opts);

/// opts as the ops API spells it (OpOptions::dtype and device are not part of it), and back (dtype and
/// device left at their defaults: a call takes them from its tensors).
ops::Options to_ops_options(const OpOptions& opts);
OpOptions to_op_options(const ops::Options& options);

}  // namespace linac
