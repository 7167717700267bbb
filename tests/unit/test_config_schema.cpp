// ConfigSchema (kernels/common/config_schema.h): every field enters the memo key, --config sets the
// tuned fields and refuses other values and keys, and every op's tuning candidates use the keys it
// declares.
#include <doctest/doctest.h>

#include "kernels/common/config_schema.h"
#include "kernels/op.h"
#include "linac/error.h"

namespace linac {
namespace {

enum class ToyKernel { a, b };

struct ToyConfig {
  DType dtype = DType::f32;
  int chunk = 64;
  int64_t block_v = 32;
  bool gated = false;
  ToyKernel which = ToyKernel::a;
  const char* name = "toy";
};

static_assert(config_schema_detail::field_count<ToyConfig>() == 6);

const ConfigSchema<ToyConfig>& toy_schema() {
  using C = ToyConfig;
  static const ConfigSchema<C> schema(field<&C::dtype>(), tuned<&C::chunk>(chunk_key()), field<&C::block_v>(),
                                      tuned<&C::gated>({"gated", {0, 1}, "a switch"}), field<&C::which>(),
                                      field<&C::name>());
  return schema;
}

TEST_CASE("config schema: every field enters the memo key") {
  const std::string base = toy_schema().key(ToyConfig{});
  auto differs = [&](void (*change)(ToyConfig&)) {
    ToyConfig c;
    change(c);
    return toy_schema().key(c) != base;
  };
  CHECK(differs([](ToyConfig& c) { c.dtype = DType::bf16; }));
  CHECK(differs([](ToyConfig& c) { c.chunk = 32; }));
  CHECK(differs([](ToyConfig& c) { c.block_v = 64; }));
  CHECK(differs([](ToyConfig& c) { c.gated = true; }));
  CHECK(differs([](ToyConfig& c) { c.which = ToyKernel::b; }));
  CHECK(differs([](ToyConfig& c) { c.name = "other"; }));
  CHECK(toy_schema().key(ToyConfig{}) == base);
  CHECK(toy_schema().key(ToyConfig{}, ToyKernel::a) != toy_schema().key(ToyConfig{}, ToyKernel::b));
  CHECK(memo_key(DType::f32, 64) != memo_key(DType::f32, 32));
}

TEST_CASE("config schema: --config sets the tuned fields and refuses other values and keys") {
  OpOptions opts;
  opts.config = {{"chunk", 32}, {"gated", 1}};
  ToyConfig cfg;
  cfg.block_v = 128;  // a default: kept
  check_config_keys("toy", opts, toy_schema().tuning());
  toy_schema().apply(opts, cfg);
  CHECK(cfg.chunk == 32);
  CHECK(cfg.gated);
  CHECK(cfg.block_v == 128);
  CHECK(chunk_key().asked(opts));  // given, whatever its value
  CHECK_FALSE(bv_key().asked(opts));

  opts.config = {{"chunk", 48}};
  CHECK_THROWS_WITH_AS(toy_schema().apply(opts, cfg), "--config chunk=48: must be one of 16, 32, 64, 128", UserError);
  opts.config = {{"block_v", 64}};  // a field that is not tuned has no key
  CHECK_THROWS_WITH_AS(check_config_keys("toy", opts, toy_schema().tuning()),
                       "toy has no tuning parameter 'block_v' (known: chunk, gated)", UserError);

  const auto lines = config_key_lines(toy_schema().tuning());
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == std::pair<std::string, std::string>{"chunk", "rows per chunk (16, 32, 64, 128)"});
  CHECK(lines[1] == std::pair<std::string, std::string>{"gated", "a switch (0, 1)"});
}

TEST_CASE("config schema: merged keys keep the first description of each") {
  TuningKeys merged = merge_tuning_keys({{chunk_key(), warps_key()}, {chunk_key({16, 32}), stages_key()}});
  REQUIRE(merged.size() == 3);
  CHECK(merged[0].allowed.size() == 4);
  CHECK(merged[2].key == "stages");
}

TEST_CASE("every op's tuning candidates use the tuning keys it declares (`linac list`'s cfg lines)") {
  for (const OpDef& op : op_registry()) {
    auto known = [&](const std::string& key) {
      for (const auto& k : op.config_keys)
        if (k.first == key) return true;
      return false;
    };
    for (const ProblemShape& shape :
         {ProblemShape{1, 1024, 2, 64, 64, false}, ProblemShape{8, 4096, 16, 128, 128, true}})
      for (DType dt : {DType::bf16, DType::f32})
        for (const auto* space : {&op.tuning_space, &op.bwd_tuning_space}) {
          if (!*space) continue;
          OpOptions opts;
          opts.dtype = dt;
          for (const Config& c : (*space)(shape, opts))
            for (const auto& [key, value] : c) {
              INFO(op.name << " " << config_str(c));
              CHECK(known(key));
            }
        }
  }
}

}  // namespace
}  // namespace linac
