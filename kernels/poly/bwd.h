// Backward of poly (`linac run poly ... do=do.npy --backward -o dq=.. -o dk=.. -o dv=..`) in the direct
// pairwise form: the slow-but-correct one (O(T^2 D) work per sequence and head, O(T D) memory, no
// degree-2 state at all). With x_ts = scale q_t . k_s, f = a + b x + c x^2 for s <= t:
//   N_t = sum_s f_ts v_s,  D_t = sum_s f_ts,  o_t = N_t / (D_t + eps)   (o_t = N_t with --no-normalize)
//   dN_t = do_t / (D_t + eps),  dD_t = -do_t . o_t / (D_t + eps)      (dN_t = do_t, dD_t = 0 unnormalized)
//   g_ts = (dN_t . v_s + dD_t) (b + 2 c x_ts)
//   dq_t = scale sum_{s<=t} g_ts k_s,  dk_s = scale sum_{t>=s} g_ts q_t,  dv_s = sum_{t>=s} f_ts dN_t
// poly_bwd_q walks the queries (N, D, then dN, dD stored, dq); poly_bwd_kv walks the keys.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kernels/op.h"

namespace linac {

OpPlan plan_poly_bwd(const TensorMap& inputs, const OpOptions& opts, const std::vector<std::string>& wanted, double a,
                     double b, double c);
std::vector<std::shared_ptr<ir::Kernel>> poly_bwd_kernels(const OpOptions& opts);

}  // namespace linac
