#include "runtime/ptxas.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <unistd.h>

#include "linac/error.h"

namespace linac {

namespace fs = std::filesystem;

std::string find_ptxas() {
  if (const char* env = std::getenv("PTXAS"); env && *env && fs::exists(env)) return env;
  if (std::system("command -v ptxas >/dev/null 2>&1") == 0) return "ptxas";
  if (fs::exists("/usr/local/cuda/bin/ptxas")) return "/usr/local/cuda/bin/ptxas";
  return "";
}

std::optional<cuda::PtxasFunctionStats> ptxas_resources(const std::string& ptx, const std::string& arch,
                                                        const std::string& entry, std::string* log,
                                                        const std::string& cubin) {
  const std::string ptxas = find_ptxas();
  if (ptxas.empty()) return std::nullopt;
  // A private directory for the module and the cubin (ptxas reads and writes files).
  std::string dir_template = (fs::temp_directory_path() / "linac-ptxas-XXXXXX").string();
  if (!mkdtemp(dir_template.data())) throw UserError(fmt::format("cannot create a directory for ptxas in {}", fs::temp_directory_path().string()));
  const fs::path dir = dir_template;
  const fs::path ptx_path = dir / "kernel.ptx";
  const std::string out = cubin.empty() ? (dir / "kernel.cubin").string() : cubin;
  std::ofstream(ptx_path) << ptx;
  const std::string cmd = fmt::format("'{}' -arch={} -v '{}' -o '{}' 2>&1", ptxas, arch, ptx_path.string(), out);
  std::string text;
  int status = -1;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
    status = pclose(p);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (log) *log = text;
  if (status != 0) throw UserError(fmt::format("ptxas ({}) rejected the PTX of {} for {}:\n{}", ptxas, entry, arch, text));
  for (const cuda::PtxasFunctionStats& f : cuda::parse_ptxas_info_log(text))
    if (f.name == entry) return f;
  return cuda::PtxasFunctionStats{entry, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt};
}

}  // namespace linac
