#include "runtime/output_files.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <mutex>
#include <unistd.h>

#include "linac/error.h"

namespace linac {

namespace fs = std::filesystem;

namespace {

// Temporaries in flight, for the signal handler: fixed storage, since a handler may not allocate.
constexpr int kMaxTemps = 256;
constexpr size_t kMaxPath = 4096;
char g_temps[kMaxTemps][kMaxPath];
volatile std::sig_atomic_t g_used[kMaxTemps];
std::mutex g_mu;

extern "C" void remove_temporaries_and_die(int sig) {
  for (int i = 0; i < kMaxTemps; ++i)
    if (g_used[i]) ::unlink(g_temps[i]);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction sa {};
      sa.sa_handler = remove_temporaries_and_die;
      sigemptyset(&sa.sa_mask);
      struct sigaction old {};
      // A signal the process ignores (nohup) stays ignored.
      if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
      sigaction(sig, &sa, nullptr);
    }
  });
}

void track(const std::string& temp, bool on) {
  std::lock_guard lock(g_mu);
  for (int i = 0; i < kMaxTemps; ++i) {
    if (on && !g_used[i] && temp.size() < kMaxPath) {
      std::memcpy(g_temps[i], temp.c_str(), temp.size() + 1);
      g_used[i] = 1;
      return;
    }
    if (!on && g_used[i] && temp == g_temps[i]) {
      g_used[i] = 0;
      return;
    }
  }
}

std::string errno_text(int err) { return std::strerror(err); }

void write_to(const std::string& file, const std::string& path, const OutputFiles::Writer& write, const char* mode) {
  std::FILE* f = std::fopen(file.c_str(), mode);
  if (!f) throw UserError(fmt::format("{}: cannot write: {}", path, errno_text(errno)));
  try {
    write(f, path);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  // A full disk often shows only here, when the buffer is flushed.
  if (std::fflush(f) != 0 || std::ferror(f)) {
    const int err = errno;
    std::fclose(f);
    throw UserError(fmt::format("{}: cannot write: {}", path, errno_text(err)));
  }
  if (std::fclose(f) != 0) throw UserError(fmt::format("{}: cannot write: {}", path, errno_text(errno)));
}

}  // namespace

void write_bytes(std::FILE* f, const void* p, size_t n, const std::string& path) {
  if (n > 0 && std::fwrite(p, 1, n, f) != n) throw UserError(fmt::format("{}: cannot write: {}", path, errno_text(errno)));
}

void OutputFiles::add(const std::string& path, const Writer& write) {
  install_handlers();
  Staged s{path, path, "", write};
  std::error_code ec;
  // A symbolic link is written through (the link stays), also when its target does not exist yet.
  fs::path target = path;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(target, ec)); ++hops) {
    if (hops == 40) throw UserError(fmt::format("{}: too many levels of symbolic links", path));
    const fs::path to = fs::read_symlink(target, ec);
    if (ec) throw UserError(fmt::format("{}: cannot read the symbolic link: {}", path, ec.message()));
    target = to.is_absolute() ? to : target.parent_path() / to;
  }
  s.target = target.string();
  const fs::file_status st = fs::status(s.target, ec);
  if (fs::is_directory(st)) throw UserError(fmt::format("{}: is a directory", path));
  if (fs::exists(st) && !fs::is_regular_file(st)) {
    staged_.push_back(std::move(s));  // a device or FIFO: written directly at commit, never replaced
    return;
  }
  s.temp = fmt::format("{}.tmp.{}", s.target, ::getpid());
  track(s.temp, true);
  staged_.push_back(s);  // tracked before writing: an interrupted write leaves nothing behind
  write_to(s.temp, path, write, "wb");
}

void OutputFiles::commit() {
  for (Staged& s : staged_) {
    if (s.temp.empty()) {
      write_to(s.target, s.path, s.write, "wb");
      continue;
    }
    if (std::rename(s.temp.c_str(), s.target.c_str()) != 0)
      throw UserError(fmt::format("{}: cannot write: {}", s.path, errno_text(errno)));
    track(s.temp, false);
    s.temp.clear();
  }
}

OutputFiles::~OutputFiles() {
  for (const Staged& s : staged_) {
    if (s.temp.empty()) continue;
    ::unlink(s.temp.c_str());
    track(s.temp, false);
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  OutputFiles out;
  out.add(path, [&](std::FILE* f, const std::string& p) { write_bytes(f, text.data(), text.size(), p); });
  out.commit();
}

}  // namespace linac
