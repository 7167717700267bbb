// The feature blocks of poly's factorized kernel (docs/ops/poly.md, "Math"): f(q.k) = a + b x + c x^2,
// x = scale q.k, as a weighted sum of phi_j(q) . phi_j(k) over blocks j of K features each:
//   j < deg2:  phi_m(x)_i = x_i x_{(i+m) mod K}  (m = j, the circulant diagonals of x (x) x: every
//              unordered pair {d, e} once), weight c scale^2 times degree2_weight(m)
//   j = deg2:  phi(x) = x, weight b scale                        (degree 1)
//   j = deg2 + 1: phi(x) = 1 (element 0 of the block), weight a  (degree 0)
// and the DSL pieces the forward and backward kernels share to build them on chip.
#pragma once
#include <cstdint>

#include "kernels/poly/fwd.h"
#include "linac/dsl.h"

namespace linac {

/// Columns of the narrowest tile a product takes: a tile of ones whose product with F sums F's rows
/// (poly_fwd_out), and the per-program partial sums of the coefficients' gradients.
inline constexpr int64_t kSumColumns = 16;

/// The [BK, BK] permutation that rolls the columns of a tile left by m along K: (X P)[:, j] =
/// X[:, (j + m) mod K] for j < K, 0 past K (P^T rolls right). A product on the tensor cores (exact: one 1
/// per column) is far cheaper than loading x at a column offset that is not a multiple of the vector
/// width.
dsl::Tile roll_matrix(int64_t BK, const dsl::Tile& K, const dsl::Tile& m, DType dt);

/// X [BT, BK] rolled by one column along K, left (column j holds column j + 1) or right: with
/// cfg.exact_k (K == BK) a static slice of [X X] (a shared-memory copy, no products), else a product with
/// `roll` (roll_matrix(1), or its transpose for the right).
dsl::Tile roll_by_one(const PolyConfig& cfg, const dsl::Tile& X, const dsl::Tile& roll, bool right);

/// The weight of degree-2 block m over c scale^2: the diagonals m = 0 and m = K/2 list each pair once
/// for (d, e) and (e, d) together, the others once for each.
dsl::Tile degree2_weight(const dsl::Tile& m, const dsl::Tile& K);

/// Whether the segment whose first row is `t0`, in a sequence of rows bos .. eos cut in segments of
/// cfg's rows, has others before it (`after` false) or after it (`after`). A sequence's first segment
/// has no state before it (the forward's states) and its last none after it (the backward's reversed
/// ones): their programs skip the states' share, and no state takes the sums of the segment at the
/// other end (the sums kernel's programs there stop at once, the scans do not read them).
dsl::Tile has_segments(const PolyConfig& cfg, const dsl::Tile& t0, const dsl::Tile& bos, const dsl::Tile& eos,
                       bool after);

/// The first row of sequence i_n's segments in the per-segment tables (segment_offsets[i_n] with
/// varlen, else i_n * ceil(T / L)). `x` is any [B, T, H, .] input.
dsl::Tile first_segment(const PolyConfig& cfg, const dsl::Tensor& x, const dsl::Tensor& segment_offsets,
                        const dsl::Tile& i_n);

/// The normalizer's tables of one segment (poly_z_rows) from `t` ([segments, H, z_rows, BK] fp32):
/// the quadratic form [BK, BK] (quadratic only; else null) and the low rows [2, BK], the degree-1 sum
/// in row 0 and the degree-0 sum in element 0 of row 1.
struct ZTables {
  dsl::Tile quadratic, low;
};
ZTables load_z_tables(const PolyConfig& cfg, const dsl::Tensor& t, const dsl::Tile& row, const dsl::Tile& h);

/// X [BT, BK] (cfg.dtype) times a quadratic form Z [BK, BK] fp32: rows (Z x_t)^T, fp32. A kernel that
/// calls it sets kb.set_tensor_core_f32(cfg.dtype != f32): three tf32 products on the tensor cores
/// (about fp32), its other products being 16-bit (in f32 kernels every product is f32 alike).
dsl::Tile times_quadratic_form(const dsl::Tile& X, const dsl::Tile& Z);

/// A [BK, cols] block of a per-segment table `t` ([segments, H, blocks, BK(, V)]) with its rows rolled
/// right by m along K (row i holds row (i - m) mod K; rows past K hold garbage that a zero column of
/// the rolled features cancels). Two loads at row offsets -m and K - m.
dsl::Tile rolled_rows(const dsl::Tensor& t, const dsl::Tile& row, const dsl::Tile& h, const dsl::Tile& m,
                      const dsl::Tile& K, int64_t BK, int64_t cols);

}  // namespace linac
