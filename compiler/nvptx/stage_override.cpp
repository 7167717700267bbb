#include "compiler/nvptx/stage_override.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "compiler/ir/printer.h"
#include "linac/error.h"

namespace linac::nvptx {

namespace fs = std::filesystem;

namespace {

bool all_of_class(std::string_view s, bool (*pred)(char)) {
  return !s.empty() && std::all_of(s.begin(), s.end(), pred);
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f'); }

/// Whether a subdirectory named `dir` is for kernels named `kernel`: "<kernel>", "<n>-<kernel>" (linac
/// dump) or "<kernel>-<12 hex digits>" (LINAC_DUMP, which appends the start of the cache key).
bool names_kernel(std::string_view dir, std::string_view kernel) {
  if (dir == kernel) return true;
  if (dir.ends_with(kernel) && dir.size() > kernel.size() + 1) {
    std::string_view prefix = dir.substr(0, dir.size() - kernel.size());
    if (prefix.back() == '-' && all_of_class(prefix.substr(0, prefix.size() - 1), is_digit)) return true;
  }
  if (dir.starts_with(kernel) && dir.size() == kernel.size() + 13 && dir[kernel.size()] == '-')
    return all_of_class(dir.substr(kernel.size() + 1), is_hex);
  return false;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw UserError(fmt::format("LINAC_OVERRIDE_DIR: cannot read {}", p.string()));
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace

const char* StageOverride::stage_name() const {
  switch (stage) {
    case OverrideStage::llvm: return "llvm";
    case OverrideStage::llvm_opt: return "llvm-opt";
    case OverrideStage::ptx: return "ptx";
  }
  return "?";
}

std::optional<StageOverride> find_stage_override(const std::string& dir, const std::string& kernel_name,
                                                 const std::string& tir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw UserError(fmt::format("LINAC_OVERRIDE_DIR={}: not a directory", dir));
  std::vector<fs::path> subdirs;
  try {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory() && names_kernel(e.path().filename().string(), kernel_name)) subdirs.push_back(e.path());
  } catch (const fs::filesystem_error& e) {
    throw UserError(fmt::format("LINAC_OVERRIDE_DIR={}: cannot list: {}", dir, e.code().message()));
  }
  std::sort(subdirs.begin(), subdirs.end());  // directory order is arbitrary; messages should not be

  // Latest stage first: it replaces whatever an earlier one would have produced.
  static const std::pair<const char*, OverrideStage> kFiles[] = {
      {kPtxFile, OverrideStage::ptx},
      {kOptimizedLlFile, OverrideStage::llvm_opt},
      {kLoweredLlFile, OverrideStage::llvm},
  };
  std::optional<StageOverride> found;
  for (const fs::path& d : subdirs) {
    // A recorded tile IR pins the subdirectory to that one kernel (same name, other configuration: not it).
    if (fs::exists(d / kRecordedTirFile) && read_file(d / kRecordedTirFile) != tir) continue;
    for (const auto& [file, stage] : kFiles) {
      if (!fs::is_regular_file(d / file)) continue;
      if (found)
        throw UserError(fmt::format("LINAC_OVERRIDE_DIR: both {} and {} override kernel {}; remove one",
                                    fs::path(found->path).parent_path().string(), d.string(), kernel_name));
      found = StageOverride{stage, (d / file).string(), read_file(d / file)};
      break;
    }
  }
  return found;
}

std::optional<StageOverride> stage_override_from_env(const ir::Kernel& k) {
  const char* env = std::getenv("LINAC_OVERRIDE_DIR");
  if (!env || !*env) return std::nullopt;
  // Once per (directory, kernel) and process: the runtime asks before every launch, and the message
  // should appear once, not per launch.
  static std::mutex mu;
  static std::map<std::string, std::optional<StageOverride>> known;
  std::string tir = ir::print(k);
  std::string key = fmt::format("{}\n{}", env, tir);
  std::lock_guard lock(mu);
  if (auto it = known.find(key); it != known.end()) return it->second;
  std::optional<StageOverride> found = find_stage_override(env, k.name, tir);
  if (found) fmt::print(stderr, "linac: kernel {}: {} replaced by {}\n", k.name, found->stage_name(), found->path);
  known.emplace(std::move(key), found);
  return found;
}

}  // namespace linac::nvptx
