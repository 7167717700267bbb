// The building blocks of linac/blocks.h: DSL code only (no IR of its own), the math in the header.
// The library's kernels record through these functions, so the order of the ops recorded here is their
// IR's: a change here changes every kernel that uses the block (tools/ptx_snapshot.sh shows which).
#include "linac/blocks.h"

#include <fmt/format.h>

namespace linac::blocks {

using namespace dsl;

namespace {

SourceLoc sl(const Loc& l) { return SourceLoc::from(l); }

bool power_of_two(int64_t n) { return n >= 2 && (n & (n - 1)) == 0; }

/// UserError at `loc` unless x is an f32 tile of rank `rank`.
void require_f32(const char* block, const char* what, const Tile& x, int rank, const Loc& loc) {
  if (x.rank(loc) != rank || x.dtype(loc) != DType::f32)
    throw UserError(sl(loc), fmt::format("{}: {} must be an f32 tile of rank {}, got {} {}", block, what, rank,
                                         dtype_name(x.dtype(loc)), fmt::join(x.shape(loc), "x")));
}

/// UserError at `loc` unless the gates g are f32 of rank 1 ([BT], per row) or 2 ([BT, K], per channel).
void require_gates(const char* block, const Tile& g, const Loc& loc) {
  require_f32(block, "g ([BT] or [BT, K])", g, g.rank(loc) == 1 ? 1 : 2, loc);
}

/// [t, c]: g_t where t > c, else 0 (the gates after column c, by row).
Tile gates_below(const Tile& g) {
  const int64_t n = g.shape()[0];
  Tile row = expand_dims(iota(n), 1), col = expand_dims(iota(n), 0);
  return where(row > col, expand_dims(g, 1), 0.0f);
}

}  // namespace

Tile unit_lower_inverse(const Tile& A, Loc loc) { return unit_lower_inverses({A}, loc)[0]; }

std::vector<Tile> unit_lower_inverses(const std::vector<Tile>& As, Loc loc) {
  if (As.empty()) return {};
  for (const Tile& A : As) require_f32("unit_lower_inverse", "A", A, 2, loc);
  const int64_t n = As[0].shape(loc)[0];
  for (const Tile& A : As)
    if (A.shape(loc)[0] != n || A.shape(loc)[1] != n || !power_of_two(n))
      throw UserError(sl(loc), fmt::format("unit_lower_inverse: A must be square with a power-of-two size >= 2{}, got {}",
                                           As.size() > 1 ? fmt::format(", the same for all {}", As.size()) : "",
                                           fmt::join(A.shape(loc), "x")));
  const DType f32 = DType::f32;
  Tile row = expand_dims(iota(n), 1), col = expand_dims(iota(n), 0);
  Tile eye = where(row == col, full({n, n}, 1.0, f32), 0.0f);
  std::vector<Tile> T(As.size());
  for (size_t b = 0; b < As.size(); ++b) T[b] = eye - where(row / 2 == col / 2, As[b], 0.0f);
  // Level by level, each product of every block before the next: the blocks' operands go to shared
  // memory side by side, and a barrier serves them all.
  for (int64_t s = 2; s < n; s *= 2) {
    Tile in_C = (row / (2 * s) == col / (2 * s)) & (row / s != col / s);
    std::vector<Tile> CT(As.size());
    for (size_t b = 0; b < As.size(); ++b) CT[b] = dot(where(in_C, As[b], 0.0f), T[b]);
    for (size_t b = 0; b < As.size(); ++b) T[b] = T[b] - dot(T[b], CT[b]);
  }
  return T;
}

std::vector<std::vector<Tile>> unit_lower_inverse_blocks(const std::vector<std::vector<Tile>>& A, Loc loc) {
  const size_t ns = A.size();
  for (size_t i = 0; i < ns; ++i) {
    if (A[i].size() < i + 1 || !A[i][i].valid())
      throw UserError(sl(loc), fmt::format("unit_lower_inverse_blocks: row {} of blocks has {} blocks; it needs the "
                                           "{} blocks up to the diagonal, the diagonal one given", i, A[i].size(), i + 1));
    for (size_t j = 0; j <= i; ++j)
      if (A[i][j].valid()) require_f32("unit_lower_inverse_blocks", "every block", A[i][j], 2, loc);
  }
  std::vector<Tile> diagonal(ns);
  for (size_t i = 0; i < ns; ++i) diagonal[i] = A[i][i];
  const std::vector<Tile> T_diagonal = unit_lower_inverses(diagonal, loc);
  std::vector<std::vector<Tile>> T(ns, std::vector<Tile>(ns));
  for (size_t i = 0; i < ns; ++i) T[i][i] = T_diagonal[i];
  for (size_t d = 1; d < ns; ++d)
    for (size_t j = 0; j + d < ns; ++j) {
      const size_t i = j + d;
      Tile X;  // absent blocks of A, and the blocks of T they leave zero, add nothing
      for (size_t m = j; m < i; ++m)
        if (A[i][m].valid() && T[m][j].valid()) X = X.valid() ? X + dot(A[i][m], T[m][j]) : dot(A[i][m], T[m][j]);
      if (X.valid()) T[i][j] = dot(T[i][i], X) * -1.0f;
    }
  return T;
}

ChunkDecays chunk_decays(const Tile& g, Loc loc) {
  require_f32("chunk_decays", "g", g, 1, loc);
  Tile below = gates_below(g);
  return {cumsum(below, 0), sum(below, 0)};
}

Tile decays_between_rows(const Tile& g, Loc loc) {
  require_f32("decays_between_rows", "g", g, 1, loc);
  return cumsum(gates_below(g), 0);
}

Tile decays_to_chunk_end(const Tile& g, Loc loc) {
  if (g.rank(loc) == 1) {
    require_f32("decays_to_chunk_end", "g", g, 1, loc);
    return sum(gates_below(g), 0);
  }
  require_f32("decays_to_chunk_end", "g ([BT] or [BT, K])", g, 2, loc);
  // Per channel: the gates of rows c+1.. (row BT-1 has none after it), summed from the end.
  const int64_t n = g.shape(loc)[0], k = g.shape(loc)[1];
  if (n == 1) return zeros({1, k}, DType::f32);
  return cumsum(concat({slice(g, 0, 1, n - 1), zeros({1, k}, DType::f32)}, 0), 0, /*reverse=*/true);
}

Tile decays_to_chunk_end_from_next(const Tile& g_next, Loc loc) {
  require_gates("decays_to_chunk_end_from_next", g_next, loc);
  // The last row's entry belongs to the next chunk: 0 in its place, then summed from the end.
  const int64_t n = g_next.shape(loc)[0];
  Tile last_row = g_next.rank() == 1 ? iota(n) == n - 1 : expand_dims(iota(n), 1) == n - 1;
  return cumsum(where(last_row, 0.0f, g_next), 0, /*reverse=*/true);
}

Tile decays_from_first_row(const Tile& g, Loc loc) {
  require_gates("decays_from_first_row", g, loc);
  const int64_t n = g.shape(loc)[0];
  Tile after_first = g.rank() == 1 ? iota(n) > 0 : expand_dims(iota(n), 1) > 0;
  return cumsum(where(after_first, g, 0.0f), 0);
}

ScoreRows rows_of(const Tile& Y, const Tile& g, Loc loc) {
  if (Y.rank(loc) != 2 || g.rank(loc) != 2 || Y.shape(loc) != g.shape(loc))
    throw UserError(sl(loc), fmt::format("rows_of: Y and g must be [n, K] tiles of one shape, got {} and {}",
                                         fmt::join(Y.shape(loc), "x"), fmt::join(g.shape(loc), "x")));
  const int64_t last = Y.shape(loc)[0] - 1;
  auto row = [last](const Tile& x) {
    return [x, last](const Operand& r) {
      Tile i = r.is_number ? constant(std::min<double>(r.number, static_cast<double>(last)), DType::i32)
                           : minimum(r.tile, static_cast<int>(last));
      return take(x, i, 0);
    };
  };
  return {row(Y), row(g)};
}

ScoreRows rows_of(const Tile& X, const Tile& Y, const Tile& g, Loc loc) {
  if (X.rank(loc) != 2 || X.shape(loc) != Y.shape(loc))
    throw UserError(sl(loc), fmt::format("rows_of: X, Y and g must be [n, K] tiles of one shape, got {}, {} and {}",
                                         fmt::join(X.shape(loc), "x"), fmt::join(Y.shape(loc), "x"),
                                         fmt::join(g.shape(loc), "x")));
  ScoreRows rows = rows_of(Y, g, loc);
  rows.x_row = rows_of(X, g, loc).y_row;
  return rows;
}

Tile gated_scores_diagonal(const Tile& X, const Tile& Y, const Tile& L, const ScoreRows& rows, bool strictly_lower,
                           Loc loc) {
  require_f32("gated_scores_diagonal", "X", X, 2, loc);
  require_f32("gated_scores_diagonal", "Y", Y, 2, loc);
  require_f32("gated_scores_diagonal", "L", L, 2, loc);
  if (X.shape(loc) != Y.shape(loc) || X.shape(loc) != L.shape(loc))
    throw UserError(sl(loc), fmt::format("gated_scores_diagonal: X, Y and L must have one shape [n, K], got {}, {} and {}",
                                         fmt::join(X.shape(loc), "x"), fmt::join(Y.shape(loc), "x"),
                                         fmt::join(L.shape(loc), "x")));
  if (!rows.y_row || !rows.gate_row)
    throw UserError(sl(loc), "gated_scores_diagonal: `rows` needs both y_row and gate_row (or use rows_of(Y, g))");
  const int64_t n = X.shape(loc)[0], K = X.shape(loc)[1];
  const DType f32 = DType::f32;
  auto on_or_below = [strictly_lower](const Operand& r, const Operand& c) { return strictly_lower ? r > c : r >= c; };
  Tile row = expand_dims(iota(n), 1), col = expand_dims(iota(n), 0);
  Tile L_hi = max(L, 0), L_lo = min(L, 0);
  Tile spread = max(L_hi - L_lo, 0);  // NaN gates compare false: the elementwise way
  Tile A = zeros({n, n}, f32);
  if_then_else(spread <= kFactorSpread, [&] {
    Tile m = expand_dims((L_hi + L_lo) * 0.5f, 0);
    A = where(on_or_below(row, col), dot(X * exp(L - m), (Y * exp(m - L)).T()), 0.0f);
  }, [&] {
    Tile Lc = zeros({K}, f32);  // row c of L, summed in the cumsum's order: L_r - L_c is 0 at r = c
    Tile y_row = rows.y_row(0), g_row = rows.gate_row(0);
    for_range(0, n, [&](Tile c) {
      Tile y_ahead = rows.y_row(c + 1), g_ahead = rows.gate_row(c + 1);  // row n at the last step: unused
      Tile yc = y_row.to(f32);
      Lc = Lc + g_row;
      y_row = y_ahead;
      g_row = g_ahead;
      Tile below = on_or_below(row, c);
      // exp(..) first, so the product computes in the f32 math's layout and a 16-bit row's load follows
      // it (passes: loads take their consumer's layout); X * yc first would fix the product in the
      // load's layout and copy each exp tile through shared memory.
      Tile x = exp(where(below, L - expand_dims(Lc, 0), 0.0f)) * X * expand_dims(yc, 0);
      A = A + where((col == c) & below, expand_dims(sum(x, 1), 1), 0.0f);  // rows reduce in registers
    }, A, Lc, y_row, g_row);
  }, A);
  return A;
}

GatedScoresGrads gated_scores_diagonal_grads(const Tile& X, const Tile& Y, const Tile& L, const Tile& dA,
                                             const ScoreRows& rows, bool strictly_lower, const Tile& dA_T, Loc loc) {
  const char* name = "gated_scores_diagonal_grads";
  require_f32(name, "X", X, 2, loc);
  require_f32(name, "Y", Y, 2, loc);
  require_f32(name, "L", L, 2, loc);
  require_f32(name, "dA", dA, 2, loc);
  if (dA_T.valid()) require_f32(name, "dA_T", dA_T, 2, loc);
  const int64_t n = X.shape(loc)[0], K = X.shape(loc)[1];
  const std::vector<int64_t> square = {n, n};
  if (X.shape(loc) != Y.shape(loc) || X.shape(loc) != L.shape(loc) || dA.shape(loc) != square ||
      (dA_T.valid() && dA_T.shape(loc) != square))
    throw UserError(sl(loc), fmt::format("{}: X, Y and L must have one shape [n, K] and dA (and dA_T) [n, n], got {}, "
                                         "{}, {} and {}", name, fmt::join(X.shape(loc), "x"),
                                         fmt::join(Y.shape(loc), "x"), fmt::join(L.shape(loc), "x"),
                                         fmt::join(dA.shape(loc), "x")));
  if (!rows.x_row || !rows.y_row || !rows.gate_row)
    throw UserError(sl(loc), fmt::format("{}: `rows` needs x_row, y_row and gate_row (or use rows_of(X, Y, g))", name));
  const DType f32 = DType::f32;
  auto on_or_below = [strictly_lower](const Operand& r, const Operand& c) { return strictly_lower ? r > c : r >= c; };
  Tile row = expand_dims(iota(n), 1), col = expand_dims(iota(n), 0);
  Tile dX = zeros({n, K}, f32), dY = zeros({n, K}, f32), A = zeros({n, n}, f32);
  Tile L_hi = max(L, 0), L_lo = min(L, 0);
  if_then_else(max(L_hi - L_lo, 0) <= kFactorSpread, [&] {  // NaN spreads compare false: elementwise
    Tile m = expand_dims((L_hi + L_lo) * 0.5f, 0);
    Tile up = exp(L - m), down = exp(m - L);
    Tile Xn = X * up, Yn = Y * down;
    A = where(on_or_below(row, col), dot(Xn, Yn.T()), 0.0f);
    dX = dot(dA, Yn) * up;
    dY = dot(dA.T(), Xn) * down;
  }, [&] {
    // Columns from last to first, carrying E[r] = g_{c+1} + ... + g_r (r > c). The rows each step needs
    // are read one step ahead (carried), so that a read from memory overlaps a step.
    Tile E = zeros({n, K}, f32);
    // Row c+1 of the gates; at c = n - 1 it lies past the block, and every row it reaches is masked.
    Tile yc = rows.y_row(n - 1), g_next = rows.gate_row(n);
    for_range(0, n, [&](Tile step) {
      Tile c = n - 1 - step;
      Tile c_ahead = where(c > 0, c - 1, 0);  // the next step's column (a harmless reread at the end)
      Tile yc_ahead = rows.y_row(c_ahead), g_ahead = rows.gate_row(c);
      E = where(row > c, E + expand_dims(g_next, 0), 0.0f);
      Tile below = on_or_below(row, c);
      Tile e = exp(E);  // exp(L_r - L_c) for r >= c (1 at r = c); rows above c are masked below
      // Column c of dA, [n, 1].
      Tile dA_c = expand_dims(dA_T.valid() ? sum(where(col == c, dA, 0.0f), 1) : take(dA, c, 1), 1);
      Tile yc32 = yc.to(f32);
      dX = dX + where(below, e * dA_c, 0.0f) * expand_dims(yc32, 0);
      A = A + where((col == c) & below, expand_dims(sum(e * X * expand_dims(yc32, 0), 1), 1), 0.0f);
      yc = yc_ahead;
      g_next = g_ahead;
    }, dX, A, E, yc, g_next);
    // Rows from first to last, carrying F[c] = g_{c+1} + ... + g_r (c < r).
    Tile F = zeros({n, K}, f32);
    Tile xr = rows.x_row(0), g_r = rows.gate_row(0);
    for_range(0, n, [&](Tile r) {
      Tile xr_ahead = rows.x_row(r + 1), g_ahead = rows.gate_row(r + 1);  // row n past the end: unused
      F = where(row < r, F + expand_dims(g_r, 0), 0.0f);
      // Row r of dA (over c), as a column [n, 1].
      Tile dA_r = expand_dims(dA_T.valid() ? sum(where(col == r, dA_T, 0.0f), 1) : take(dA, r, 0), 1);
      dY = dY + where(strictly_lower ? row < r : row <= r, exp(F) * dA_r, 0.0f) * expand_dims(xr.to(f32), 0);
      xr = xr_ahead;
      g_r = g_ahead;
    }, dY, F, xr, g_r);
  }, dX, dY, A);
  return {A, dX, dY};
}

Tile gated_scores(const Tile& X, const Tile& Y, const Tile& g, bool strictly_lower, Loc loc) {
  require_f32("gated_scores", "g", g, 2, loc);
  const int64_t BT = g.shape(loc)[0];
  if (X.rank(loc) != 2 || X.shape(loc) != g.shape(loc) || Y.shape(loc) != g.shape(loc) || BT % 16 != 0)
    throw UserError(sl(loc), fmt::format("gated_scores: X, Y and g must be [BT, K] with BT a multiple of 16, got {}, "
                                         "{} and {}", fmt::join(X.shape(loc), "x"), fmt::join(Y.shape(loc), "x"),
                                         fmt::join(g.shape(loc), "x")));
  constexpr int64_t S = 16;
  const int ns = static_cast<int>(BT / S);
  const DType f32 = DType::f32;
  Tile Xf = X.to(f32), Yf = Y.to(f32);
  std::vector<Tile> Xs(ns), Ys(ns), gs(ns), R(ns), tot(ns);
  for (int i = 0; i < ns; ++i) {
    Xs[i] = ns == 1 ? Xf : slice(Xf, 0, i * S, S);
    Ys[i] = ns == 1 ? Yf : slice(Yf, 0, i * S, S);
    gs[i] = ns == 1 ? g : slice(g, 0, i * S, S);
  }
  auto diagonal = [&](int i) {
    return gated_scores_diagonal(Xs[i], Ys[i], cumsum(gs[i], 0), rows_of(Ys[i], gs[i]), strictly_lower, loc);
  };
  if (ns == 1) return diagonal(0);
  Tile A = zeros({BT, BT}, f32);
  for (int i = 0; i < ns; ++i) A = place(A, diagonal(i), {i * S, i * S});
  for (int j = 0; j + 1 < ns; ++j) {
    R[j] = decays_to_chunk_end(gs[j]);  // g_{c+1} + ... + g_{end of j}
    tot[j] = sum(gs[j], 0);
  }
  for (int i = 1; i < ns; ++i) {
    // X_i .* exp(g_{n+1} + ... + g_r), n the first row of block i.
    Tile Xd = Xs[i] * exp(decays_from_first_row(gs[i]));
    Tile decay = take(gs[i], 0, 0);  // from the end of block j to row n, inclusive: g_n, then + tot_{j+1} ..
    for (int j = i - 1; j >= 0; --j) {
      Tile Yd = Ys[j] * exp(R[j] + expand_dims(decay, 0));
      A = place(A, dot(Xd, Yd.T()), {i * S, j * S});
      if (j > 0) decay = decay + tot[j];
    }
  }
  return A;
}

namespace {

/// state_update's checks and body; `K` is [BT, K] or, `transposed`, [K, BT].
Tile update_state(const char* what, const Tile& S, const Tile& K, bool transposed, const Tile& V, const Tile& log_decay,
                  bool in_place, Loc loc) {
  require_f32(what, "S", S, 2, loc);
  const std::vector<int64_t> s = S.shape(loc);
  const int rows = transposed ? 1 : 0;  // K's axis along the chunk's rows
  if (K.rank(loc) != 2 || V.rank(loc) != 2 || K.shape(loc)[rows] != V.shape(loc)[0] || K.shape(loc)[1 - rows] != s[0] ||
      V.shape(loc)[1] != s[1])
    throw UserError(sl(loc), fmt::format("{}: K {} and V [BT, V] must match S [K, V], got K {}, V {} and S {}", what,
                                         transposed ? "[K, BT]" : "[BT, K]", fmt::join(K.shape(loc), "x"),
                                         fmt::join(V.shape(loc), "x"), fmt::join(s, "x")));
  const Tile& d = log_decay;
  if (d.valid() && (d.dtype(loc) != DType::f32 || !(d.is_scalar(loc) || (d.rank(loc) == 1 && d.shape(loc)[0] == s[0]))))
    throw UserError(sl(loc), fmt::format("{}: log_decay must be an f32 scalar or [{}] (one per key row of S), "
                                         "got {} {}", what, s[0], dtype_name(d.dtype(loc)), fmt::join(d.shape(loc), "x")));
  auto decayed = [&] { return !d.valid() ? S : d.is_scalar() ? S * exp(d) : S * expand_dims(exp(d), 1); };
  auto product = [&] { return dot(transposed ? K.to(V.dtype()) : K.to(V.dtype()).T(), V); };
  if (in_place) {
    Tile D = decayed();
    return D + product();
  }
  Tile P = product();
  return decayed() + P;
}

}  // namespace

Tile state_update(const Tile& S, const Tile& K, const Tile& V, const Tile& log_decay, bool in_place, Loc loc) {
  return update_state("state_update", S, K, false, V, log_decay, in_place, loc);
}

Tile state_update_transposed_keys(const Tile& S, const Tile& KT, const Tile& V, const Tile& log_decay, bool in_place,
                                  Loc loc) {
  return update_state("state_update_transposed_keys", S, KT, true, V, log_decay, in_place, loc);
}

Tile inverse_norms(const Tile& x, int axis, const Operand& eps, Loc loc) {
  if (x.is_scalar(loc) || (x.rank(loc) != 1 && x.rank(loc) != 2) || axis < 0 || axis >= x.rank(loc))
    throw UserError(sl(loc), fmt::format("inverse_norms: x must be a vector or a [rows, D] tile and axis one of its "
                                         "axes, got rank {} and axis {}", x.rank(loc), axis));
  Tile xf = x.to(DType::f32);
  return rsqrt(sum(xf * xf, axis) + eps);
}

Tile l2normalize(const Tile& x, int axis, const Operand& eps, Loc loc) {
  Tile xf = x.to(DType::f32);
  Tile inv = inverse_norms(xf, axis, eps, loc);
  return xf.rank() == 1 ? xf * inv : xf * expand_dims(inv, axis);
}

}  // namespace linac::blocks
