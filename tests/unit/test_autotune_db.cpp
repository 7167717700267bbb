// The tuning database: what later runs read back (keys, later lines winning, damaged lines ignored).
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <unistd.h>

#include <fstream>

#include "kernels/linear_attn/op.h"
#include "kernels/op.h"
#include "runtime/autotune.h"
#include "runtime/cuda_driver.h"

using namespace linac;

TEST_CASE("tuning db: lookup reads the latest line of a key and ignores damaged lines") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / fmt::format("linac-tunedb-{}", ::getpid());
  fs::create_directories(dir);
  const char* old = std::getenv("LINAC_CACHE_DIR");
  std::string saved = old ? old : "";
  ::setenv("LINAC_CACHE_DIR", dir.c_str(), 1);
  {
    std::ofstream f(dir / "tuning.db");
    f << "opA|GPU|132sm|sm_90|B=1,T<=64,H=1,K=64,V=64|bf16\tbv=64,warps=4\t0.5\n";
    f << "garbage without tabs\n";
    f << "opA|GPU|132sm|sm_90|B=1,T<=64,H=1,K=64,V=64|bf16\tbv=128,warps=8\t0.4\n";
    f << "opB|GPU|132sm|sm_90|B=1,T<=64,H=1,K=64,V=64|bf16\tbv=notanumber\t0.4\n";
    f << "opC|GPU|132sm|sm_90|B=1,T<=64,H=1,K=64,V=64|bf16\tdefault\t0.4\n";
  }
  auto a = lookup_tuned("opA|GPU|132sm|sm_90|B=1,T<=64,H=1,K=64,V=64|bf16");
  REQUIRE(a.has_value());
  CHECK(config_str(*a) == "bv=128,warps=8");
  CHECK_FALSE(lookup_tuned("opB|GPU|132sm|sm_90|B=1,T<=64,H=1,K=64,V=64|bf16").has_value());
  auto c = lookup_tuned("opC|GPU|132sm|sm_90|B=1,T<=64,H=1,K=64,V=64|bf16");
  REQUIRE(c.has_value());
  CHECK(c->empty());
  CHECK_FALSE(lookup_tuned("missing").has_value());
  if (old)
    ::setenv("LINAC_CACHE_DIR", saved.c_str(), 1);
  else
    ::unsetenv("LINAC_CACHE_DIR");
  fs::remove_all(dir);
}

TEST_CASE("autotuned_config: forms the tuning space does not describe keep their defaults, without a GPU") {
  // The tuner once received a --backward call with the forward's tuning space and asked the backward's
  // plan for 'o' without 'do' (every backward case of tools/e2e.py failed on the GPU). --backward now
  // only looks up what `linac tune --backward` stored (its key needs the GPU's name, so it is not in
  // this GPU-free test). These forms must return before any tuning, and before touching the GPU.
  const OpDef op = linear_attn_op();
  TensorMap inputs = op.random_inputs(ProblemShape{1, 16, 1, 16, 16, false}, 1);
  OpOptions base;
  base.device = Device::cuda;
  for (int form = 1; form < 4; ++form) {
    OpOptions o = base;
    if (form == 1) o.normalize = true;
    if (form == 2) o.recurrent = true;
    if (form == 3) o.chunk_size = 32;
    CAPTURE(form);
    CHECK(autotuned_config(op, inputs, o).empty());
  }
  // The delta rules' training pair: the forward asked for saved_* outputs, the backward given them.
  CHECK(autotuned_config(op, inputs, base, {"o", "saved_w", "saved_t", "saved_h", "saved_v_new"}).empty());
  TensorMap with_saved = inputs;
  with_saved["saved_w"] = inputs.at("k");
  CHECK(autotuned_config(op, with_saved, base).empty());
  OpOptions given = base;
  given.config = {{"bv", 32}};
  CHECK(config_str(autotuned_config(op, inputs, given)) == "bv=32");
}

TEST_CASE("tuning: a configuration that spells out the defaults has the defaults' launch signature") {
  // tune() times one candidate per signature: gla's space lists {} and, for 16-bit head dim 128,
  // the same configuration spelled out.
  const OpDef& op = find_op("gla");
  ProblemShape shape{1, 40, 2, 128, 128, false};
  TensorMap in = op.random_inputs(shape, 3);
  auto signature = [&](Config c) {
    OpOptions o;
    o.dtype = DType::bf16;
    o.config = std::move(c);
    return launch_signature(op.prepare(in, o, {"o"}));
  };
  const std::string dflt = signature({});
  CHECK(!dflt.empty());
  CHECK(signature({{"chunk", 32}, {"bv", 128}, {"warps", 4}, {"stages", 2}}) == dflt);
  CHECK(signature({{"chunk", 32}, {"bv", 64}, {"warps", 4}, {"stages", 2}}) != dflt);
  CHECK(signature({{"chunk", 64}, {"bv", 128}, {"warps", 4}, {"stages", 2}}) != dflt);
}

TEST_CASE("tuning keys: `linac tune OP --shape` and a call of OP at that shape share the key") {
  // `linac tune` keys by the parsed --shape (gated only with --gated); a call keys by op.shape_of of
  // its inputs. gla's and gated_delta_rule's shape_of report their gate, so until session 10 the
  // backward's tuned entries of both (stored only by `linac tune --backward`) were never found:
  // bench_bwd.py timed gla's walks at B2 T16384 H16 after tuning had picked split=1.
  cuda::DeviceInfo dev;
  dev.name = "GPU";
  dev.sm_count = 132;
  dev.cc_major = 9;
  for (const OpDef& op : op_registry()) {
    bool optional_gate = false;
    for (const auto& in : op.inputs) optional_gate |= in.name == "g" && !in.required;
    for (bool gated : {false, true}) {
      if (gated && !optional_gate) continue;  // --gated is linear_attn's
      const ProblemShape cli{2, 40, 3, 16, 16, gated};
      const ProblemShape call = op.shape_of(op.random_inputs(cli, 1));
      for (bool bwd : {false, true})
        CHECK_MESSAGE(tuning_key_for(op, cli, DType::bf16, bwd, dev) == tuning_key_for(op, call, DType::bf16, bwd, dev),
                      op.name, gated ? " gated" : "", bwd ? " --backward" : "");
    }
  }
}
