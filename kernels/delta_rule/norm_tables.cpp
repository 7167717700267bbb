#include "kernels/delta_rule/norm_tables.h"

#include <algorithm>

#include "kernels/delta_rule/fwd.h"
#include "linac/blocks.h"

namespace linac {

using namespace dsl;

InverseNormTables InverseNormTables::declare(KernelBuilder& kb, bool with_q) {
  InverseNormTables t;
  if (with_q) t.q = kb.tensor("q_norms", DType::f32, 3);
  t.k = kb.tensor("k_norms", DType::f32, 3);
  return t;
}

Tile InverseNormTables::load_q(const Tile& chunk, const Tile& i_h, int64_t row0, int64_t rows) const {
  return dsl::load(q, {chunk, i_h, row0}, {kIndex, kIndex, rows});
}

Tile InverseNormTables::load_k(const Tile& chunk, const Tile& i_h, int64_t row0, int64_t rows) const {
  return dsl::load(k, {chunk, i_h, row0}, {kIndex, kIndex, rows});
}

Tile InverseNormTables::store_inverse_norms(const Tensor& table, const Tile& x, const Tile& chunk, const Tile& i_h,
                                            int64_t row0) {
  Tile r = blocks::inverse_norms(x, 1, kDeltaL2NormEps);
  store(table, {chunk, i_h, row0}, {kIndex, kIndex, x.shape()[0]}, r);
  return r;
}

void add_inverse_norm_tables(OpPlan& plan, int64_t chunks, int64_t heads, int64_t chunk) {
  for (const char* name : {"q_norms", "k_norms"})
    plan.tensors[name] = HostTensor::zeros(DType::f32, {std::max<int64_t>(chunks, 1), heads, chunk});
}

}  // namespace linac
