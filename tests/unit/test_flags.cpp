// signal and wait_for (ir.h, dsl.h): flags between launches that run at once. On the CPU interpreter
// launches run one after another, so a consumer's wait must find its flags already signalled; these
// tests check the counting, the errors, and where the ops may stand.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/interp/interp.h"
#include "compiler/ir/verifier.h"
#include "linac/dsl.h"

using namespace linac;
using namespace linac::dsl;

namespace {

interp::TensorArg i32_view(std::vector<int32_t>& v) {
  return {v.data(), DType::i32, {static_cast<int64_t>(v.size())}, {1}};
}

/// Each program signals flag program_id(0) once.
std::shared_ptr<ir::Kernel> producer() {
  KernelBuilder kb("producer");
  Tensor flags = kb.tensor("flags", DType::i32, 1);
  signal(flags, {program_id(0)});
  return kb.finish();
}

/// One program walks `n` chunks, waiting for flag i + 1 (clamped) at the head of iteration i, as a
/// consumer of pipelined loads does, and for `count` signals of each.
std::shared_ptr<ir::Kernel> consumer() {
  KernelBuilder kb("consumer");
  Tensor flags = kb.tensor("flags", DType::i32, 1);
  Tile n = kb.scalar("n", DType::i32), count = kb.scalar("count", DType::i32);
  wait_for(flags, {0}, count);
  for_range(0, n, [&](Tile i) { wait_for(flags, {minimum(i + 1, n - 1)}, count); });
  return kb.finish();
}

}  // namespace

TEST_CASE("flags: signals count per program; waits pass once their count is reached (0: always), else name the flag") {
  std::vector<int32_t> flags(4, 0);
  std::vector<interp::Arg> args{i32_view(flags)};
  interp::run(*producer(), {4, 1, 1}, args);
  CHECK(flags == std::vector<int32_t>{1, 1, 1, 1});
  interp::run(*producer(), {4, 1, 1}, args);  // a second producer (two kernels signalling each chunk)
  CHECK(flags == std::vector<int32_t>{2, 2, 2, 2});
  std::vector<interp::Arg> wait_args{i32_view(flags), 4.0, 2.0};
  interp::run(*consumer(), {1, 1, 1}, wait_args);
  flags[2] = 1;
  try {
    interp::run(*consumer(), {1, 1, 1}, wait_args);
    FAIL("a flag short of its count passed");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("the flag is 1 but 2 is waited for") != std::string::npos);
  }
  std::vector<int32_t> none(4, 0);  // a count of 0 waits for nothing
  std::vector<interp::Arg> no_wait{i32_view(none), 4.0, 0.0};
  interp::run(*consumer(), {1, 1, 1}, no_wait);
  std::vector<int32_t> few(2, 0);
  std::vector<interp::Arg> out_of_range{i32_view(few)};
  CHECK_THROWS_WITH_AS(interp::run(*producer(), {3, 1, 1}, out_of_range),
                       doctest::Contains("outside the flags tensor"), UserError);
}

TEST_CASE("flags: signal and wait_for hold a barrier, so neither may stand in an if") {
  KernelBuilder kb("k");
  Tensor flags = kb.tensor("flags", DType::i32, 1);
  Tile c = kb.scalar("c", DType::i32);
  CHECK_THROWS_WITH_AS(if_then(c > 0, [&] { wait_for(flags, {0}, 1); }), doctest::Contains("stands in an if"),
                       UserError);
}

TEST_CASE("flags: the flags tensor is i32 and takes one offset per dim") {
  KernelBuilder kb("k");
  Tensor f32 = kb.tensor("f", DType::f32, 1), flags = kb.tensor("flags", DType::i32, 2);
  CHECK_THROWS_WITH_AS(signal(f32, {0}), doctest::Contains("must be i32"), UserError);
  CHECK_THROWS_WITH_AS(wait_for(flags, {0}, 1), doctest::Contains("rank 2 but 1 offsets"), UserError);
}
