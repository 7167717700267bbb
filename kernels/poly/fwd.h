// Normalized polynomial-kernel attention (docs/ops/poly.md, seed 000):
//   o_t = sum_{s<=t} f(x_ts) v_s / sum_{s<=t} f(x_ts),  f(x) = a + b x + c x^2,  x_ts = scale q_t . k_s
// with the factorized state of seed 000 (degrees 0, 1, 2), never the T x T score matrix and never a
// feature map phi(k) per token in memory. The kernels in the DSL.
//
// Feature blocks. f(q.k) = a + b q.k + c (q.k)^2 is a sum over feature blocks phi_j(q) . phi_j(k) with
// weights: degree 0 (one feature, 1), degree 1 (q itself), and the degree-2 products q_d q_e taken
// once per unordered pair {d, e} through the K's circulant diagonals: block m (0 <= m <= K/2) is
//   phi_m(x)_j = x_j x_{(j+m) mod K},  j < K,   weight 1 for m = 0 and m = K/2, 2 otherwise,
// which lists every pair exactly once (the symmetric half of x (x) x, (K/2 + 1) K entries instead of
// K(K+1)/2: 1.5% more at K = 64), each block a full [BT, K] tile built on chip from two loads of x.
// The state of block j is S_j = sum_s phi_j(k_s)^T v_s [K, V]; the output's share is w_j phi_j(q_t) S_j.
// The denominator's degree-2 share needs no feature blocks: sum_s (q.k_s)^2 = q^T Z q with the
// quadratic form Z = sum_s k_s k_s^T [K, K] (one product per chunk, not one per block).
//
// The segmented schedule (poly_fwd_sums, poly_fwd_scan, poly_fwd_out). The degree-2 state is
// K(K+1)/2 x V per head, too big for one program, and a head is one of only B*H walks: the sequence is
// cut in segments of `segment_chunks` chunks. poly_fwd_sums runs one program per (feature block, V
// block, segment, head), each summing its block's state over its segment in registers; poly_fwd_scan
// turns the segments' sums into the state before every segment, states [segments, H, blocks, BK, V];
// poly_fwd_out runs one program per (chunk, V block, head): the segment's tokens up to its chunk
// directly, f(x) on the scores (causal inside its chunk), and everything before the segment from the
// stored state. Work O(T (L + K^2) D) for segments of L tokens, memory O(T K^2 V / L) for the states:
// with L ~ K^2 both are the factorized form's O(T K^2 V) and O(T D).
//
// No gate and no initial/final state: the op starts every sequence from an empty state.
#pragma once
#include <memory>

#include "linac/dtype.h"

namespace linac {

namespace ir {
struct Kernel;
}

/// Added to the denominator (fp32) of the normalized output.
inline constexpr double kPolyEps = 1e-6;

/// Compile-time configuration of the poly kernels. Every field specializes the kernel; the
/// coefficients a, b, c and the scale are runtime scalars.
struct PolyConfig {
  DType dtype = DType::f32;  // q, k, v and o
  int chunk = 64;            // BT: rows per chunk (segmented form; both kernels alike)
  int segment_chunks = 16;   // chunks per segment: every kernel of a plan cuts the same segments (rows)
  int block_k = 64;          // BK >= K (the whole key dim lives in one program; masked past K)
  int block_v = 64;          // BV: value columns per program
  bool normalize = true;     // divide by the kernel sum (+ kPolyEps); false: the plain numerator
  bool quadratic = true;     // c != 0: the degree-2 blocks (none when c == 0)
  bool varlen = false;       // cu_seqlens [N+1] present, B == 1
  bool coefficient_grads = false;  // poly_bwd_dq: also the gradients of a, b, c (partial sums per program)
  bool store_den = false;          // poly_fwd_out (normalize): also den [B, T, H] fp32 for the backward
  bool exact_k = false;            // K == block_k: a roll by one is a static slice of [x x], not a product
  bool longest_first = false;      // poly_fwd_out/poly_bwd_prepare without varlen: the chunks late in their
                                   // segment (the longest direct part) first, else in grid order
  int num_warps = 4;
  int num_stages = 2;
  int min_ctas = 1;  // blocks per SM ptxas sizes the segmented kernels' registers for (64K / (threads x blocks))
};

/// Feature blocks of the segmented form: the degree-2 blocks, degree 1, degree 0.
int poly_feature_blocks(const PolyConfig& cfg);
/// Degree-2 blocks: BK/2 + 1 when quadratic (those past floor(K/2) are unused), else 0.
int poly_degree2_blocks(const PolyConfig& cfg);
/// Rows of the normalizer tables (zsums, zstates: [segments, H, rows, BK] fp32), sums over tokens s
/// with weights w_s (1 in the forward, dd in the backward): when quadratic, rows 0 .. BK-1 the
/// quadratic form sum w_s x_s x_s^T; then the degree-1 row sum w_s x_s; then the degree-0 row with
/// sum w_s in element 0.
int poly_z_rows(const PolyConfig& cfg);

/// Records the segmented form's first kernel: each segment's own sums of the feature blocks' states,
/// sums [segments, H, blocks, BK, V] fp32 and with normalize the normalizer's, zsums [segments, H,
/// poly_z_rows, BK] fp32. Forward: phi(k)^T v and w = 1; backward: phi(q)^T dn and w = dd. Grid ((blocks -
/// 1) x V blocks, plus one program for the normalizer's tables when normalized, segments of a sequence, N*H), or with varlen (.., all segments, H) and segment_indices [segments, 2]
/// = (sequence, segment of it). Parameters: k v (backward: q dn [dd]) [cu_seqlens segment_indices] sums
/// [zsums].
std::shared_ptr<ir::Kernel> build_poly_sums(const PolyConfig& cfg, bool backward);
/// Records the scan of the sums over each sequence's segments: the state before every segment, states
/// [segments, H, blocks, BK, V] in cfg.dtype (zstates [segments, H, poly_z_rows, BK] fp32), or with
/// `reverse` after it (rstates, rzstates). Grid (blocks x V blocks, plus one program for the
/// normalizer's tables when normalized, N*H). Parameters: k (reverse: q) [cu_seqlens segment_offsets]
/// sums [zsums] states [zstates]; segment_offsets [N+1] the first segment of each sequence (varlen;
/// dense: n * ceil(T / L)).
std::shared_ptr<ir::Kernel> build_poly_scan(const PolyConfig& cfg, bool reverse);
/// Records the segmented form's output kernel. Grid (chunks, V blocks, N*H), or (total chunks, V blocks,
/// H) with varlen. Parameters: q k v [cu_seqlens chunk_indices segment_offsets] states [zstates] o
/// [den: cfg.store_den, the denominator with eps, fp32 [B, T, H]] scale a b [c]. With `grad` (normalize, one V block): do instead of o in, dn = do / den (cfg.dtype)
/// and dd = -(do . o) / den ([B, T, H] fp32) out.
std::shared_ptr<ir::Kernel> build_poly_fwd_out(const PolyConfig& cfg, bool grad = false);
/// Records dn = do / den and dd = -(do . o) / den from the forward's o and den (saved): one program per
/// (chunk, sequence x head), one V block. Parameters: do o den [cu_seqlens chunk_indices] dn dd.
std::shared_ptr<ir::Kernel> build_poly_bwd_from_saved(const PolyConfig& cfg);
/// Records the token-by-token forward kernel: one program per (V block, sequence x head) walks the tokens
/// (cfg.chunk is unused). The degree-2 state lives in scratch the op allocates, state2 [N*H, K(K+1)/2, V]
/// fp32, the symmetric part row by row (entries (d, e >= d) at row d*K - d(d-1)/2 + (e - d)), and its
/// normalizer in norm2 [grid[0]*N*H, K(K+1)/2, 1] fp32, a slab per program: programs never share
/// scratch. Parameters: q k v [cu_seqlens] [state2] [norm2] o scale a b [c].
std::shared_ptr<ir::Kernel> build_poly_recurrent(const PolyConfig& cfg);

}  // namespace linac
