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

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// Compile-time configuration of the pairwise backward kernels.
struct PolyBwdConfig {
  DType dtype = DType::f32;
  int block_k = 64, block_v = 64;
  bool normalize = true, varlen = false;
};

/// The query walk: N_t, D_t, then dN_t, dD_t (stored for the key walk) and dq_t. Parameters: q k v do
/// [cu_seqlens] dn dd dq a b c scale.
std::shared_ptr<ir::Kernel> build_poly_bwd_q(const PolyBwdConfig& cfg);
/// The key walk: dk_s and dv_s from dn, dd. Parameters: q k v [cu_seqlens] dn dd dk dv a b c scale.
std::shared_ptr<ir::Kernel> build_poly_bwd_kv(const PolyBwdConfig& cfg);

}  // namespace linac
