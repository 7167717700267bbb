#include "tools/dump.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "linac/error.h"
#include "runtime/ptxas.h"
#include "runtime/output_files.h"

namespace linac {

namespace fs = std::filesystem;

namespace {

void write_file(const fs::path& p, const std::string& text) { write_file_atomically(p.string(), text); }

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream f(path);
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  return lines;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

std::string annotate_ptx(const std::string& ptx) {
  static const std::regex file_re(R"(^\s*\.file\s+(\d+)\s+\"([^\"]*)\")");
  static const std::regex loc_re(R"(^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+)");
  // NVPTX prints the .file table after the code: read it first.
  std::map<int, std::string> files;
  std::smatch m;
  {
    std::istringstream in(ptx);
    for (std::string line; std::getline(in, line);)
      if (std::regex_search(line, m, file_re)) files[std::stoi(m[1])] = m[2];
  }
  std::map<std::string, std::vector<std::string>> sources;
  std::istringstream in(ptx);
  std::string out, current;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, file_re)) continue;
    if (std::regex_search(line, m, loc_re)) {
      int file = std::stoi(m[1]), ln = std::stoi(m[2]);
      std::string path = files.count(file) ? files[file] : "?";
      std::string key = fmt::format("{}:{}", path, ln);
      if (key != current) {
        current = key;
        if (!sources.count(path)) sources[path] = read_lines(path);
        const auto& src = sources[path];
        std::string text = ln >= 1 && ln <= static_cast<int>(src.size()) ? trim(src[ln - 1]) : "";
        out += fmt::format("\n// {}  {}\n", key, text);
      }
      continue;
    }
    out += line + "\n";
  }
  return out;
}

std::vector<std::string> dump_kernels(const std::vector<std::shared_ptr<ir::Kernel>>& kernels, const std::string& dir,
                                      const nvptx::GpuTarget& target) {
  std::vector<std::string> summary;
  const std::string ptxas = find_ptxas();
  for (size_t i = 0; i < kernels.size(); ++i) {
    const ir::Kernel& k = *kernels[i];
    nvptx::CompiledKernel c = nvptx::compile_kernel(k, target, nvptx::stage_override_from_env(k));
    fs::path d = fs::path(dir) / fmt::format("{}-{}", i, c.entry);
    std::error_code ec;
    fs::create_directories(d, ec);
    if (ec) throw UserError(fmt::format("cannot create {}: {}", d.string(), ec.message()));
    write_file(d / nvptx::kRecordedTirFile, c.tir);
    write_file(d / nvptx::kLayoutsTirFile, c.tir_layouts);
    write_file(d / nvptx::kSmemPlanFile, c.smem_plan);
    write_file(d / nvptx::kLoweredLlFile, c.llvm_ir);
    write_file(d / nvptx::kOptimizedLlFile, c.llvm_ir_opt);
    write_file(d / nvptx::kPtxFile, c.ptx);
    write_file(d / "7-annotated.txt", annotate_ptx(c.ptx));
    std::string line = fmt::format("{}: {} threads, {} bytes of shared memory", d.string(), c.num_threads, c.smem_bytes);
    if (!ptxas.empty()) {
      // ptxas -v: registers, spills, stack; the cubin for cuobjdump/nvdisasm (SASS needs those tools,
      // which come with the CUDA toolkit on the GPU machine).
      std::string cmd = fmt::format("{} -arch={} -v '{}' -o '{}' > '{}' 2>&1", ptxas, target.name(),
                                    (d / nvptx::kPtxFile).string(), (d / "8-kernel.cubin").string(),
                                    (d / "9-resources.txt").string());
      int rc = std::system(cmd.c_str());
      std::ifstream log(d / "9-resources.txt");
      std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      std::smatch m;
      static const std::regex regs_re(R"(Used (\d+) registers)"), spill_re(R"((\d+) bytes spill stores)");
      if (rc == 0 && std::regex_search(text, m, regs_re)) {
        line += fmt::format(", {} registers", m[1].str());
        if (std::regex_search(text, m, spill_re)) line += fmt::format(", {} bytes spilled", m[1].str());
      } else {
        line += ", ptxas failed (see 9-resources.txt)";
      }
      if (std::system("command -v cuobjdump >/dev/null 2>&1") == 0)
        std::system(fmt::format("cuobjdump -sass '{}' > '{}' 2>&1", (d / "8-kernel.cubin").string(),
                                (d / "10-kernel.sass").string())
                        .c_str());
    } else {
      line += " (no ptxas here: no cubin or resource report)";
    }
    summary.push_back(line);
  }
  return summary;
}

}  // namespace linac
