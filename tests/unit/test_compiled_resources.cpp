// rt::compile reports ptxas's registers and spills when ptxas is installed (issue 22, point 4): a small
// kernel spills nothing, a tile far past the register file does; without ptxas the fields are empty
// and the test says it skipped.
#include <doctest/doctest.h>

#include "linac/dsl.h"
#include "linac/runtime.h"
#include "runtime/ptxas.h"

using namespace linac;
using namespace linac::dsl;
namespace rt = linac::runtime;

namespace {

/// o = x @ x^T + 1 for an [n, 64] block: n = 32 at 4 warps fits in registers; n = 128 at 2 warps does
/// not (a [128, 128] fp32 product over 64 threads: 256 values each).
std::shared_ptr<ir::Kernel> gram(int64_t n, int warps) {
  KernelBuilder kb("gram");
  kb.set_num_warps(warps);
  Tensor x = kb.tensor("x", DType::bf16, 2);
  Tensor o = kb.tensor("o", DType::f32, 2);
  Tile X = load(x, {0, 0}, {n, 64});
  store(o, {0, 0}, {n, n}, dot(X, X.T()) + 1.0f);
  return kb.finish();
}

}  // namespace

TEST_CASE("rt::compile reports registers and spills from ptxas") {
  if (find_ptxas().empty()) {
    MESSAGE("no ptxas here ($PTXAS, PATH, /usr/local/cuda/bin): skipped");
    CHECK_FALSE(rt::compile(*gram(32, 4)).registers.has_value());
    return;
  }
  rt::Compiled small = rt::compile(*gram(32, 4), rt::Arch::sm_90a);
  REQUIRE(small.registers.has_value());
  CHECK(*small.registers > 0);
  CHECK(small.spill_store_bytes.value_or(-1) == 0);
  rt::Compiled big = rt::compile(*gram(128, 2), rt::Arch::sm_80);
  REQUIRE(big.registers.has_value());
  CHECK(big.spill_store_bytes.value_or(0) > 0);
}
