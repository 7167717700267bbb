// Building blocks of chunked linear-attention kernels, written in the DSL (linac/dsl.h): the pieces
// the library's own kernels are made of, public so that a variant reuses them instead of rewriting
// them. Each is a C++ function that records DSL ops into the kernel being built (call it inside a
// KernelBuilder, like any DSL op); none is a kernel of its own, and none adds an op the DSL lacks.
//
//   using namespace linac::dsl;
//   namespace blocks = linac::blocks;
//   Tile G = cumsum(g, 0);                                          // chunk-local cumulative gates
//   Tile A = blocks::gated_scores(K, K, g, /*strictly_lower=*/true) * expand_dims(beta, 1);
//   Tile T = blocks::unit_lower_inverse(A);                         // (I + A)^-1
//
// Their own namespace (not linac::dsl) because they are composites, not primitives: a call reads
// `blocks::unit_lower_inverse(A)`, which says where to look for its math, and the names stay free for
// a user's own helpers under `using namespace linac::dsl`.
//
// Conventions: rows (tokens of a chunk) run along axis 0; gates g are log-decays (g <= 0, so that
// exp(g) <= 1); every result is f32. Shapes are checked when the block is called (UserError at the
// caller's line); the ops inside record this library's source locations.
#pragma once
#include <functional>
#include <vector>

#include "linac/dsl.h"

namespace linac::blocks {

using dsl::Loc;
using dsl::Operand;
using dsl::Tile;

// ---- the unit-lower-triangular inverse (the UT transform of the delta rules) -----------------------

/// T = (I + A)^-1 for a strictly lower triangular f32 [n, n] tile A, n a power of two >= 2 (entries of
/// A on and above the diagonal must be 0), in fp32, by doubling: T starts as the inverses of the 2x2
/// diagonal blocks of I + A ([[1, 0], [a, 1]]^-1 = [[1, 0], [-a, 1]]); with T holding the inverses
/// D1^-1, D2^-1 of the two s x s halves of every 2s x 2s diagonal block [[D1, 0], [C, D2]],
///   [[D1, 0], [C, D2]]^-1 = [[D1^-1, 0], [-D2^-1 C D1^-1, D2^-1]] = T - T C T
/// exactly (T C T has its entries where T has none). log2(n) - 1 levels of two products each.
Tile unit_lower_inverse(const Tile& A, Loc loc = Loc::current());

/// unit_lower_inverse of several independent blocks (the same size), level by level: each level's
/// products of all blocks side by side, so that their shared-memory operands share barriers.
std::vector<Tile> unit_lower_inverses(const std::vector<Tile>& A, Loc loc = Loc::current());

/// The same inverse by blocks: A[i][j] (j <= i, each [s, s]) are the blocks of a strictly lower
/// triangular matrix (its diagonal blocks strictly lower themselves, s a power of two); returns T[i][j]
/// (j <= i) of T = (I + A)^-1, the blocks above the diagonal being 0. Diagonal blocks are inverted
/// alone (unit_lower_inverses, all at once), those below by block substitution, one block diagonal at
/// a time:
///   T_ij = -T_ii (A_ij T_jj + A_i,j+1 T_j+1,j + ... + A_i,i-1 T_i-1,j)      (i > j)
/// Blocks of A below the diagonal may be absent (an invalid Tile): they are zero, and so is every
/// block of T that only they would reach (returned absent; e.g. A block diagonal by groups of blocks
/// gives T block diagonal by the same groups). No product touches a block known to be zero: at n = 32
/// in blocks of 16, 14 products of 16x16x16 against unit_lower_inverse's 8 of 32x32x32.
std::vector<std::vector<Tile>> unit_lower_inverse_blocks(const std::vector<std::vector<Tile>>& A,
                                                         Loc loc = Loc::current());

// ---- chunk-local decays: sums of the gates between rows ------------------------------------------
// Every decay here is a sum of the gates it spans, never a difference b_r - b_c of cumulative sums:
// that difference loses the small gates next to a very negative one (-1e4 leaves nothing of a -1e-3
// in fp32), and is NaN for -inf gates (-inf - -inf); a sum is exact to rounding and -inf where it
// should be (exp: 0, the state dropped as the recurrence drops it).

/// The decays inside a chunk from its per-row gates g [BT] (f32):
///   D [BT, BT]: D[r, c] = g_{c+1} + ... + g_r for r > c, 0 on and above the diagonal
///   R [BT]:     R[c] = g_{c+1} + ... + g_{BT-1}, the decay from row c to the chunk's end
/// so that exp(D[r, c]) is the decay from row c to row r (b_r - b_c for b = cumsum(g)).
struct ChunkDecays {
  Tile D, R;
};
ChunkDecays chunk_decays(const Tile& g, Loc loc = Loc::current());
/// chunk_decays' D alone (what is recorded is kept, used or not: ask only for what the kernel uses).
Tile decays_between_rows(const Tile& g, Loc loc = Loc::current());
/// chunk_decays' R alone: R[c] = g_{c+1} + ... + g_{BT-1}. Also per channel: for gates g [BT, K],
/// R[c, d] = g_{c+1,d} + ... + g_{BT-1,d} ([BT, K]; 0 on the last row), summed directly.
Tile decays_to_chunk_end(const Tile& g, Loc loc = Loc::current());
/// decays_to_chunk_end from the gates one row ahead: g_next[c] = g_{c+1} ([BT] or [BT, K], f32; its
/// last row, the next chunk's first gate or padding, is not used), as a kernel gets them by loading the
/// gates once more from the chunk's first row + 1. A second load of the same rows reads the cache; the
/// tile form shifts g by a row through shared memory. Per row the R of decays_to_chunk_end, summed
/// from the end (a scan, no [BT, BT] tile).
Tile decays_to_chunk_end_from_next(const Tile& g_next, Loc loc = Loc::current());
/// The decays from a chunk's first row, per row (g [BT]) or per channel (g [BT, K]), f32:
///   F[r] = g_1 + ... + g_r   (0 on row 0)
/// so that exp(F) carries row 0's values to row r (the reference gate's factor of gated_scores).
Tile decays_from_first_row(const Tile& g, Loc loc = Loc::current());

// ---- gated scores: the decay-aware attention matrix of a chunk -------------------------------------

/// Where the elementwise form of gated_scores_diagonal reads row r of Y and of the gates g (those L
/// sums). rows_of reads them from tiles (take); a kernel may read them from global memory instead, one
/// row ahead of use (gla_chunk does: the loads' latency then overlaps a step). Each is called with r in
/// 0..n, n the block's rows (r = n: the read-ahead past the last row, never used; it must not fault).
struct ScoreRows {
  std::function<Tile(const Operand& r)> y_row;     // row r of Y, [K] (any float dtype)
  std::function<Tile(const Operand& r)> gate_row;  // row r of the gates g, [K] f32
  std::function<Tile(const Operand& r)> x_row = {};  // row r of X, [K]: gated_scores_diagonal_grads only
};
/// The rows of the tiles Y and g [n, K] (the read-ahead row n reads row n - 1 again).
ScoreRows rows_of(const Tile& Y, const Tile& g, Loc loc = Loc::current());
/// The rows of the tiles X, Y and g [n, K], for gated_scores_diagonal_grads.
ScoreRows rows_of(const Tile& X, const Tile& Y, const Tile& g, Loc loc = Loc::current());

/// The gates' spread up to which gated_scores_diagonal takes the factored form: its factors stay within
/// exp(+-30). logsigmoid gates spread about 25 over 16 rows (fla's benchmark).
inline constexpr double kFactorSpread = 60.0;

/// One diagonal block of the per-channel gated scores, exactly:
///   A[r, c] = sum_d x_rd y_cd exp(L_rd - L_cd)   for r >= c (r > c with strictly_lower), else 0
/// with X, Y [n, K] f32 and L = cumsum(g, 0) [n, K] the block's cumulative gates (n = 16 in the
/// library), in fp32. Two ways, chosen per program at run time:
///  - factored, when the gates' spread over the block (max_r L_rd - min_r L_rd, largest over the
///    channels d) is at most kFactorSpread: with the reference gate m_d midway between the extremes,
///      A = (X .* exp(L - m)) (Y .* exp(m - L))^T               (one fp32 product)
///    every factor is within exp(+-kFactorSpread / 2): neither overflows nor underflows, and each term
///    is its exact value to a few ulps;
///  - elementwise otherwise (steep gates; NaN spreads too): one column c at a time, row c of L summed
///    from `rows`' gate rows in the cumsum's order, every exponent L_r - L_c <= 0 masked to r >= c
///    before exp (so the diagonal's is exactly exp(0) = 1).
/// Gates of -inf give NaN spreads and differences: floor them first (exp(-128) is 0 in fp32).
Tile gated_scores_diagonal(const Tile& X, const Tile& Y, const Tile& L, const ScoreRows& rows,
                           bool strictly_lower = false, Loc loc = Loc::current());

/// The gradients of a diagonal block of gated scores (A as gated_scores_diagonal defines it, X, Y, L
/// [n, K] f32 as there) from dA = dLoss/dA [n, n] f32, which must be 0 where A is (above the diagonal;
/// on it too with strictly_lower):
///   dX[r, d] = sum_{c <= r} dA[r, c] y_cd exp(L_rd - L_cd)     dY[c, d] = sum_{r >= c} dA[r, c] x_rd exp(L_rd - L_cd)
/// (c < r and r > c with strictly_lower), and A itself, which a backward needs as well (dV = A^T dO)
/// and which costs little beside them. In fp32, the two ways of gated_scores_diagonal, per program:
///  - factored where the spread is at most kFactorSpread: with Xn = X .* exp(L - m), Yn = Y .* exp(m - L),
///      A = Xn Yn^T (masked),   dX = (dA Yn) .* exp(L - m),   dY = (dA^T Xn) .* exp(m - L)
///  - elementwise otherwise, in two walks over the block's rows so that every sum is a row sum (warp
///    shuffles on the GPU) and none runs down a column: column c at a time (row c of Y) for dX and A,
///    then row r at a time (row r of X) for dY. Their exponents L_r - L_c are sums of the gates g_{c+1}
///    .. g_r read from `rows` and carried from step to step, never differences of L: the gates after a
///    very negative one keep their precision. `rows` needs all three readers (rows_of(X, Y, g)).
/// Each step reads one column (then one row) of dA with take, from dA's shared-memory copy on the GPU;
/// given dA_T (dA's transpose, say as its own product), it picks them by masked row sums of dA and
/// dA_T instead (which is faster depends on the kernel; gla's backward measures both).
/// As for gated_scores_diagonal, floor gates of -inf in L first (the rows' gates need no floor: they
/// are only summed).
struct GatedScoresGrads {
  Tile A, dX, dY;
};
GatedScoresGrads gated_scores_diagonal_grads(const Tile& X, const Tile& Y, const Tile& L, const Tile& dA,
                                             const ScoreRows& rows, bool strictly_lower = false,
                                             const Tile& dA_T = Tile(), Loc loc = Loc::current());

/// The gated scores of a whole chunk, X, Y [BT, K] (any float dtype), per-channel gates g [BT, K] f32
/// (BT a multiple of 16), with G = cumsum(g, 0):
///   A[r, c] = sum_d x_rd y_cd exp(G_rd - G_cd)   for r >= c (r > c with strictly_lower), else 0
/// in fp32, [BT, BT], by 16-row blocks: the diagonal ones by gated_scores_diagonal (their rows from
/// the tiles), those below with the reference gate at the first row n of block i,
///   A_ij = (X_i .* exp(G_i - G_n)) (Y_j .* exp(G_n - G_j))^T      (i > j)
/// where G_i - G_n = g_{n+1} + ... + g_r and G_n - G_j = g_{c+1} + ... + g_n are sums of gates
/// (<= 0): no factor exceeds 1, so no gate however steep overflows a product. As for the diagonal
/// blocks, floor gates of -inf first.
Tile gated_scores(const Tile& X, const Tile& Y, const Tile& g, bool strictly_lower = false,
                  Loc loc = Loc::current());

// ---- the chunked state walk ------------------------------------------------------------------------
// A chunked kernel walks the chunks of a sequence in order (for_range), carrying the state S [K, V] in
// fp32: each chunk reads it for its outputs (the state's share Q S, Q's rows decayed from the chunk's
// start as the gates ask) and then updates it with its own keys and values, those decayed to the
// chunk's end. With per-channel gates g [BT, K]:
//   Tile S = zeros({BK, BV}, DType::f32);
//   for_range(0, num_chunks, [&](Tile i) {
//     ...                                                     // Q, K, V, g of chunk i
//     Tile O = dot((Q * exp(cumsum(g, 0))).to(dt), S.to(dt)) + dot(A.to(dt), V);   // A: gated_scores
//     S = blocks::state_update(S, K * exp(blocks::decays_to_chunk_end(g)), V, sum(g, 0));
//   }, S);

/// The state after a chunk: S' = diag(exp(d)) S + K^T V, with S [K, V] f32, K [BT, K], V [BT, V] and d
/// the state's log-decay over the chunk (the sum of its gates): an f32 scalar (one gate per head), [K]
/// f32 (per key channel), or an invalid Tile() (no decay: S + K^T V). The product runs in V's dtype, K
/// cast to it (keys decayed in fp32 can be passed as they are): on the tensor cores for 16-bit V,
/// accumulating in fp32.
/// The order is a choice of speed, not of results, and which is faster depends on the walk (docs/ops/
/// linear_attn.md, delta_rule.md, gla.md, "Measured"). By default the product is recorded first and
/// the decayed state added to it: the product need not wait for the decay, and only a multiply and an
/// add stand between one chunk's state and the next. With in_place the decayed state is recorded first
/// and the product accumulates into it: one [K, V] accumulator instead of two and no add, the better
/// choice where registers are short (a walk that spills). The library's walks keep the order they
/// were tuned with: in place in delta_rule_fwd and gla_fwd, the product first in the others.
Tile state_update(const Tile& S, const Tile& K, const Tile& V, const Tile& log_decay = Tile(), bool in_place = false,
                  Loc loc = Loc::current());
/// state_update with the keys given transposed, KT [K, BT]: for a K^T formed where it is computed (the
/// gated linear_attn walk decays K^T in the registers wgmma takes its A operand from).
Tile state_update_transposed_keys(const Tile& S, const Tile& KT, const Tile& V, const Tile& log_decay = Tile(),
                                  bool in_place = false, Loc loc = Loc::current());

// ---- l2norm ----------------------------------------------------------------------------------------

/// 1 / sqrt(sum_axis x^2 + eps) in f32 (x cast to f32 first): [rows] for rows of a [rows, D] tile along
/// axis 1, a scalar for a vector along axis 0. eps is a number or an f32 scalar Tile (fla's l2norm:
/// 1e-6).
Tile inverse_norms(const Tile& x, int axis, const Operand& eps, Loc loc = Loc::current());
/// x / sqrt(sum_axis x^2 + eps) in f32: the rows of a [rows, D] tile (axis 1) or a vector (axis 0)
/// normalized to unit length.
Tile l2normalize(const Tile& x, int axis, const Operand& eps, Loc loc = Loc::current());

}  // namespace linac::blocks
