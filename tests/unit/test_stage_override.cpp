// The override directory's lookup rules: which subdirectory serves a kernel and which of its files
// replaces which stage (compiler/nvptx/stage_override.h). The CLI round trip is tests/python/test_override.py.
#include <doctest/doctest.h>

#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <unistd.h>

#include "compiler/nvptx/stage_override.h"
#include "linac/error.h"

using namespace linac;
using namespace linac::nvptx;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / fmt::format("linac-override-{}", ::getpid());
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("stage override: dump layouts, tile IR pinning, latest stage wins") {
  TempDir d;
  // linac dump's layout: two kernels of one name, told apart by their recorded tile IR.
  write(d.path / "0-fwd" / kRecordedTirFile, "ir A");
  write(d.path / "0-fwd" / kPtxFile, "ptx A");
  write(d.path / "0-fwd" / kOptimizedLlFile, "ll A");
  write(d.path / "1-fwd" / kRecordedTirFile, "ir B");
  write(d.path / "1-fwd" / kOptimizedLlFile, "ll B");
  // Names that merely contain the kernel's name serve other kernels.
  write(d.path / "0-fwd_deg2" / kPtxFile, "other");
  write(d.path / "x-fwd" / kPtxFile, "other");

  auto a = find_stage_override(d.path.string(), "fwd", "ir A");
  REQUIRE(a.has_value());
  CHECK(a->stage == OverrideStage::ptx);  // the PTX wins over the .ll beside it
  CHECK(a->text == "ptx A");
  CHECK(std::string(a->stage_name()) == "ptx");

  auto b = find_stage_override(d.path.string(), "fwd", "ir B");
  REQUIRE(b.has_value());
  CHECK(b->stage == OverrideStage::llvm_opt);
  CHECK(b->text == "ll B");
  CHECK(b->path == (d.path / "1-fwd" / kOptimizedLlFile).string());

  CHECK_FALSE(find_stage_override(d.path.string(), "fwd", "ir C").has_value());  // another configuration
  CHECK_FALSE(find_stage_override(d.path.string(), "bwd", "ir A").has_value());
}

TEST_CASE("stage override: LINAC_DUMP and bare names; two claimants are a user error") {
  TempDir d;
  write(d.path / "fwd-0123456789ab" / kLoweredLlFile, "lowered");
  auto l = find_stage_override(d.path.string(), "fwd", "any ir");
  REQUIRE(l.has_value());
  CHECK(l->stage == OverrideStage::llvm);

  write(d.path / "fwd" / kPtxFile, "hand-written");  // no recorded IR: serves every kernel named fwd
  CHECK_THROWS_AS(find_stage_override(d.path.string(), "fwd", "any ir"), UserError);
  CHECK_THROWS_AS(find_stage_override((d.path / "missing").string(), "fwd", "any ir"), UserError);
}
