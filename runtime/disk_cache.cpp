#include "runtime/disk_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <system_error>

#include "linac/error.h"

namespace linac {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kManifestName = "MANIFEST";
constexpr std::string_view kManifestMagic = "linac-cache-manifest 1";
constexpr std::string_view kMetaName = "meta.json";
// Bounds that keep a garbage MANIFEST or meta.json from making us allocate gigabytes.
constexpr size_t kMaxManifestBytes = size_t{1} << 20;
constexpr size_t kMaxManifestFiles = 4096;
constexpr size_t kMaxMetaBytes = size_t{16} << 20;
constexpr size_t kMaxNameLength = 128;
constexpr size_t kKeyLength = 64;
// Staging and trash dirs older than this belong to crashed processes; younger ones may be in use.
constexpr auto kStaleAge = std::chrono::hours(1);
// How often put() retries when a concurrent clear() or a corrupt entry gets in its way.
constexpr int kPutAttempts = 3;

constexpr std::string_view kFixHint =
    "set LINAC_CACHE_DIR to a writable directory, or LINAC_DISABLE_CACHE=1 to run without the cache";

std::string errno_text(int err) {
  return std::generic_category().message(err);
}

[[noreturn]] void cache_unusable(std::string_view what, const fs::path& path, const std::string& why) {
  throw UserError(fmt::format("linac cache: cannot {} {}: {} ({})", what, path.string(), why, kFixHint));
}

/// The value of an environment variable, or nullopt when it is unset or empty.
std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

/// A boolean knob: set to anything but "" or "0" means on.
bool env_flag(const char* name) {
  auto v = env_value(name);
  return v && *v != "0";
}

/// Owns a POSIX file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  /// Closes now, returning close()'s errno (0 on success): a failed close can mean lost data.
  int close() {
    const int r = ::close(fd_);
    fd_ = -1;
    return r == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

int open_dir(const fs::path& path) {
  return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool valid_key(std::string_view key) {
  return key.size() == kKeyLength && is_hex(key);
}

/// Names must be safe path components and fit the MANIFEST's space-separated lines.
bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength || name[0] == '.' || name == kManifestName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-' || c == '+';
  });
}

/// "<pid>.<64 random bits>": unique across processes sharing the cache and threads within one.
std::string unique_suffix() {
  thread_local std::mt19937_64 rng = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), static_cast<unsigned>(::getpid()),
                      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count())};
    return std::mt19937_64(seq);
  }();
  return fmt::format("{}.{:016x}", ::getpid(), rng());
}

std::chrono::system_clock::time_point to_time_point(const struct timespec& ts) {
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
}

/// Writes all of `data` to a new file and fsyncs it. Returns 0 or an errno.
int write_file(const fs::path& path, std::string_view data) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.ok()) return errno;
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd.get(), p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return errno;
  return fd.close();
}

/// Makes a rename or a new file in `dir` durable. Best effort: some filesystems refuse fsync on dirs.
void fsync_dir(const fs::path& dir) {
  Fd fd(open_dir(dir));
  if (fd.ok()) ::fsync(fd.get());
}

/// Reads the regular file `name` in `dirfd` if its size is `expected_size` (any size up to `max_size`
/// when `expected_size` is nullopt). nullopt on any problem.
std::optional<std::string> read_file_at(int dirfd, const std::string& name, std::optional<uint64_t> expected_size,
                                        size_t max_size) {
  Fd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.ok()) return std::nullopt;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  const auto size = static_cast<uint64_t>(st.st_size);
  if (expected_size ? size != *expected_size : size > max_size) return std::nullopt;
  std::string data(size, '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd.get(), data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;  // error, or the file shrank under us
    got += static_cast<size_t>(n);
  }
  return data;
}

struct ManifestLine {
  uint64_t size = 0;
  std::string sha256;
  std::string name;
};

std::string format_manifest(const CacheEntry& entry) {
  std::string out = fmt::format("{}\nfiles {}\n", kManifestMagic, entry.files.size());
  for (const auto& [name, data] : entry.files) out += fmt::format("{} {} {}\n", data.size(), sha256_hex(data), name);
  out += "end\n";
  return out;
}

bool parse_u64(std::string_view s, uint64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

/// Parses a MANIFEST strictly: anything but exactly what format_manifest() writes is garbled, so a
/// truncated or half-overwritten manifest is caught.
std::optional<std::vector<ManifestLine>> parse_manifest(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return std::nullopt;  // the last line must end with a newline
    lines.push_back(text.substr(0, nl));
    text.remove_prefix(nl + 1);
  }
  if (lines.size() < 3 || lines[0] != kManifestMagic || lines.back() != "end") return std::nullopt;
  uint64_t count = 0;
  if (!lines[1].starts_with("files ") || !parse_u64(lines[1].substr(6), count) || count > kMaxManifestFiles ||
      count != lines.size() - 3)
    return std::nullopt;
  std::vector<ManifestLine> out;
  std::set<std::string_view> seen;
  for (size_t i = 2; i + 1 < lines.size(); ++i) {
    std::string_view line = lines[i];
    const size_t sp1 = line.find(' ');
    if (sp1 == std::string_view::npos) return std::nullopt;
    const size_t sp2 = line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos) return std::nullopt;
    ManifestLine m;
    const std::string_view hash = line.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string_view name = line.substr(sp2 + 1);
    if (!parse_u64(line.substr(0, sp1), m.size) || hash.size() != kKeyLength || !is_hex(hash) || !valid_name(name) ||
        !seen.insert(name).second)
      return std::nullopt;
    m.sha256 = hash;
    m.name = name;
    out.push_back(std::move(m));
  }
  return out;
}

/// Reads and verifies the entry open at `dirfd`. On failure, returns nullopt and says why in `why`.
std::optional<CacheEntry> read_entry(int dirfd, std::string& why) {
  auto manifest_text = read_file_at(dirfd, std::string(kManifestName), std::nullopt, kMaxManifestBytes);
  if (!manifest_text) {
    why = "MANIFEST missing or unreadable";
    return std::nullopt;
  }
  auto manifest = parse_manifest(*manifest_text);
  if (!manifest) {
    why = "MANIFEST garbled";
    return std::nullopt;
  }
  CacheEntry entry;
  for (const ManifestLine& m : *manifest) {
    auto data = read_file_at(dirfd, m.name, m.size, 0);
    if (!data) {
      why = fmt::format("{} missing, unreadable or not {} bytes", m.name, m.size);
      return std::nullopt;
    }
    if (sha256_hex(*data) != m.sha256) {
      why = fmt::format("{} does not match its SHA-256", m.name);
      return std::nullopt;
    }
    entry.files.emplace(m.name, std::move(*data));
  }
  return entry;
}

bool same_inode(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/// Removes whatever is at `path` (an entry dir, or junk where one should be) without readers ever seeing
/// it half deleted: rename it into the trash in one step, then delete it there. With `expected`, only
/// if `path` is still that inode, so a reader that found an old entry corrupt does not remove a good
/// one a racer has just installed. Best effort: returns whether this call moved it.
bool discard(const fs::path& version_dir, const fs::path& path, const struct stat* expected) {
  if (expected != nullptr) {
    struct stat now;
    if (::lstat(path.c_str(), &now) != 0 || !same_inode(now, *expected)) return false;
  }
  const fs::path trash = version_dir / "trash";
  std::error_code ec;
  fs::create_directories(trash, ec);
  const fs::path target = trash / fmt::format("{}.{}", path.filename().string(), unique_suffix());
  if (::rename(path.c_str(), target.c_str()) != 0) return false;
  fs::remove_all(target, ec);
  return true;
}

/// Deletes children of `dir` not modified for kStaleAge: staging and trash dirs of crashed processes.
void remove_stale(const fs::path& dir) {
  std::error_code ec;
  const auto now = std::chrono::system_clock::now();
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    struct stat st;
    if (::lstat(it->path().c_str(), &st) == 0 && now - to_time_point(st.st_mtim) > kStaleAge)
      stale.push_back(it->path());
  }
  for (const fs::path& p : stale) fs::remove_all(p, ec);
}

/// Creates `dir` and its parents; UserError naming it when that fails (for instance a regular file on
/// the way, or no permission).
void make_dirs(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) cache_unusable("create directory", dir, ec.message());
  // create_directories() is content with an existing non-directory on some library versions.
  if (!fs::is_directory(dir, ec)) cache_unusable("create directory", dir, "not a directory");
}

}  // namespace

// --- CacheKey ------------------------------------------------------------------------------------------

CacheKey& CacheKey::add(std::string_view field_name, std::string_view value) {
  for (std::string_view part : {field_name, value}) {
    // 8-byte little-endian length, then the bytes: no two field sequences hash the same bytes.
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(part.size()) >> (8 * i));
    hash_.update(len, sizeof len);
    hash_.update(part);
  }
  return *this;
}

std::string CacheKey::hex() const {
  Sha256 copy = hash_;
  return to_hex(copy.finish());
}

// --- location and options -------------------------------------------------------------------------------

fs::path cache_dir() {
  auto absolute = [](const fs::path& p, const char* var) {
    std::error_code ec;
    fs::path abs = fs::absolute(p, ec);
    if (ec) cache_unusable(fmt::format("use ${} =", var), p, ec.message());
    return abs.lexically_normal();
  };
  if (auto dir = env_value("LINAC_CACHE_DIR")) return absolute(*dir, "LINAC_CACHE_DIR");
  if (auto xdg = env_value("XDG_CACHE_HOME"); xdg && fs::path(*xdg).is_absolute())
    return fs::path(*xdg).lexically_normal() / "linac";
  if (auto home = env_value("HOME")) return absolute(fs::path(*home) / ".cache" / "linac", "HOME");
  throw UserError(
      fmt::format("linac cache: cannot choose a cache directory: LINAC_CACHE_DIR, XDG_CACHE_HOME and "
                  "HOME are all unset ({})",
                  kFixHint));
}

DiskCacheOptions DiskCacheOptions::from_env() {
  DiskCacheOptions o;
  o.disabled = env_flag("LINAC_DISABLE_CACHE");
  o.log = env_flag("LINAC_CACHE_LOG");
  return o;
}

// --- DiskCache -------------------------------------------------------------------------------------------

DiskCache::DiskCache(fs::path root, DiskCacheOptions options) : root_(std::move(root)), options_(options) {}

DiskCache::DiskCache(DiskCache&& other) noexcept : root_(std::move(other.root_)), options_(other.options_) {
  counters_.hits = other.counters_.hits.load();
  counters_.misses = other.counters_.misses.load();
  counters_.corrupt_entries = other.counters_.corrupt_entries.load();
  counters_.puts = other.counters_.puts.load();
  counters_.lost_races = other.counters_.lost_races.load();
}

fs::path DiskCache::version_dir() const {
  return root_ / fmt::format("v{}", kCacheFormatVersion);
}

fs::path DiskCache::entry_dir(const std::string& key) const {
  return version_dir() / key.substr(0, 2) / key;
}

DiskCacheStats DiskCache::stats() const {
  return {counters_.hits.load(), counters_.misses.load(), counters_.corrupt_entries.load(), counters_.puts.load(),
          counters_.lost_races.load()};
}

std::optional<CacheEntry> DiskCache::get(const std::string& key) {
  LINAC_INTERNAL_CHECK(valid_key(key), fmt::format("malformed cache key '{}'", key));
  auto miss = [&](std::string_view detail) -> std::optional<CacheEntry> {
    ++counters_.misses;
    if (options_.log) fmt::print(stderr, "linac cache: miss {}{}\n", key, detail);
    return std::nullopt;
  };
  if (options_.disabled) return miss(" (LINAC_DISABLE_CACHE)");

  const fs::path dir = entry_dir(key);
  auto corrupt = [&](const std::string& why, const struct stat* seen) -> std::optional<CacheEntry> {
    ++counters_.corrupt_entries;
    discard(version_dir(), dir, seen);
    if (options_.log) fmt::print(stderr, "linac cache: corrupt {} ({}), removed; it will be rebuilt\n", key, why);
    return miss("");
  };

  Fd fd(open_dir(dir));
  if (!fd.ok()) {
    const int err = errno;
    struct stat st;
    if (err == ENOENT) return miss("");
    // ENOTDIR/ELOOP: either something that is not a directory sits where the entry should be (corrupt),
    // or the root is not a directory, which put() reports.
    if (err == ENOTDIR || err == ELOOP) {
      if (::lstat(dir.c_str(), &st) == 0) return corrupt("not a directory", &st);
      return miss("");
    }
    cache_unusable("read", dir, errno_text(err));
  }
  struct stat seen;
  if (::fstat(fd.get(), &seen) != 0) cache_unusable("read", dir, errno_text(errno));
  std::string why;
  auto entry = read_entry(fd.get(), why);
  if (!entry) {
    // If the entry was replaced or removed while we read it, a racer did it; the path is not ours to
    // discard, and the discard() inode check sees to that.
    return corrupt(why, &seen);
  }
  ::futimens(fd.get(), nullptr);  // mark as recently used for prune(); harmless if it fails
  ++counters_.hits;
  if (options_.log) fmt::print(stderr, "linac cache: hit {}\n", key);
  return entry;
}

void DiskCache::put(const std::string& key, const CacheEntry& entry) {
  LINAC_INTERNAL_CHECK(valid_key(key), fmt::format("malformed cache key '{}'", key));
  for (const auto& [name, data] : entry.files)
    LINAC_INTERNAL_CHECK(valid_name(name), fmt::format("cache file name '{}' is not allowed", name));
  if (options_.disabled) return;

  const fs::path vdir = version_dir();
  const fs::path tmp = vdir / "tmp";
  make_dirs(tmp);
  fs::path staging;
  for (;;) {
    staging = tmp / fmt::format("{}.{}", key, unique_suffix());
    if (::mkdir(staging.c_str(), 0755) == 0) break;
    if (errno != EEXIST) cache_unusable("create directory", staging, errno_text(errno));
  }
  // From here on the staging dir must not outlive this call, whatever happens.
  struct StagingGuard {
    const fs::path& path;
    ~StagingGuard() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } guard{staging};

  for (const auto& [name, data] : entry.files) {
    if (int err = write_file(staging / name, data)) cache_unusable("write", staging / name, errno_text(err));
  }
  // The MANIFEST goes last: an entry with a complete MANIFEST had all its files written first.
  if (int err = write_file(staging / std::string(kManifestName), format_manifest(entry)))
    cache_unusable("write", staging / std::string(kManifestName), errno_text(err));
  fsync_dir(staging);

  const fs::path shard = vdir / key.substr(0, 2);
  const fs::path final_dir = shard / key;
  for (int attempt = 1;; ++attempt) {
    make_dirs(shard);
    if (::rename(staging.c_str(), final_dir.c_str()) == 0) {
      fsync_dir(shard);
      if (Fd fd(open_dir(final_dir)); fd.ok()) ::futimens(fd.get(), nullptr);
      ++counters_.puts;
      if (options_.log) fmt::print(stderr, "linac cache: put {}\n", key);
      return;
    }
    const int err = errno;
    struct stat st;
    const bool occupied = ::lstat(final_dir.c_str(), &st) == 0;
    if (!occupied) {
      // ENOENT: a concurrent clear() or prune() removed the shard dir between make_dirs() and rename().
      if (err == ENOENT && attempt < kPutAttempts) continue;
      cache_unusable(fmt::format("install {} as", staging.string()), final_dir, errno_text(err));
    }
    // Another process installed this key first. Keep its entry if it is sound.
    if (S_ISDIR(st.st_mode)) {
      Fd fd(open_dir(final_dir));
      std::string why;
      if (fd.ok() && read_entry(fd.get(), why)) {
        ::futimens(fd.get(), nullptr);
        ++counters_.puts;
        ++counters_.lost_races;
        if (options_.log) fmt::print(stderr, "linac cache: put {} (already installed by another process)\n", key);
        return;
      }
    }
    if (attempt >= kPutAttempts) {
      // Something keeps writing junk at this path. Not worth failing the compile over.
      if (options_.log) fmt::print(stderr, "linac cache: put {} gave up: the entry keeps being corrupted\n", key);
      return;
    }
    discard(vdir, final_dir, &st);
  }
}

std::vector<EntryInfo> DiskCache::list() const {
  std::vector<EntryInfo> out;
  const fs::path vdir = version_dir();
  std::error_code ec;
  fs::directory_iterator shards(vdir, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory || ec == std::errc::not_a_directory) return out;
    cache_unusable("read", vdir, ec.message());
  }
  for (fs::directory_iterator end; !ec && shards != end; shards.increment(ec)) {
    const std::string shard = shards->path().filename().string();
    if (shard.size() != 2 || !is_hex(shard)) continue;  // tmp/, trash/, lock
    std::error_code ec2;
    for (fs::directory_iterator it(shards->path(), ec2), end2; !ec2 && it != end2; it.increment(ec2)) {
      const std::string key = it->path().filename().string();
      if (!valid_key(key) || !key.starts_with(shard)) continue;
      Fd fd(open_dir(it->path()));
      struct stat st;
      if (!fd.ok() || ::fstat(fd.get(), &st) != 0) continue;  // vanished, or junk get() will clean up
      EntryInfo info;
      info.key = key;
      info.mtime = to_time_point(st.st_mtim);
      std::error_code ec3;
      for (fs::directory_iterator f(it->path(), ec3), end3; !ec3 && f != end3; f.increment(ec3)) {
        struct stat fst;
        if (::lstat(f->path().c_str(), &fst) != 0) continue;
        info.size_bytes += static_cast<uint64_t>(fst.st_size);
        const std::string name = f->path().filename().string();
        if (name != kManifestName) info.files.push_back(name);
      }
      std::sort(info.files.begin(), info.files.end());
      info.meta_json = read_file_at(fd.get(), std::string(kMetaName), std::nullopt, kMaxMetaBytes);
      out.push_back(std::move(info));
    }
  }
  std::sort(out.begin(), out.end(), [](const EntryInfo& a, const EntryInfo& b) { return a.key < b.key; });
  return out;
}

size_t DiskCache::clear() {
  const fs::path vdir = version_dir();
  size_t removed = 0, kept = 0;
  std::string why;
  for (const EntryInfo& e : list()) {
    const fs::path dir = entry_dir(e.key);
    if (discard(vdir, dir, nullptr)) {
      ++removed;
      continue;
    }
    const int err = errno;
    std::error_code ec;
    if (!fs::exists(dir, ec)) continue;  // another process removed it first
    ++kept;
    // A rename into trash/ that failed for want of trash/ itself: the cache directory is not writable.
    if (why.empty()) why = ::access(vdir.c_str(), W_OK) != 0 ? errno_text(errno) : errno_text(err);
  }
  remove_stale(vdir / "tmp");
  remove_stale(vdir / "trash");
  if (kept > 0)
    throw UserError(fmt::format("cache {}: removed {} entries, could not remove {}: {}", root_.string(), removed, kept,
                                why));
  return removed;
}

bool DiskCache::prune(uint64_t max_bytes) {
  const fs::path vdir = version_dir();
  std::error_code ec;
  if (!fs::exists(vdir, ec)) return true;  // nothing cached yet; do not create the cache just to prune it
  const fs::path lock_path = vdir / "lock";
  Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock.ok()) cache_unusable("open", lock_path, errno_text(errno));
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return false;  // another process is pruning; one pruner is enough
    cache_unusable("lock", lock_path, errno_text(errno));
  }
  std::vector<EntryInfo> entries = list();
  uint64_t total = 0;
  for (const EntryInfo& e : entries) total += e.size_bytes;
  // Oldest first; the key breaks ties so the order does not depend on the directory's.
  std::sort(entries.begin(), entries.end(), [](const EntryInfo& a, const EntryInfo& b) {
    return a.mtime != b.mtime ? a.mtime < b.mtime : a.key < b.key;
  });
  for (const EntryInfo& e : entries) {
    if (total <= max_bytes) break;
    discard(vdir, entry_dir(e.key), nullptr);
    total -= e.size_bytes;
  }
  remove_stale(vdir / "tmp");
  remove_stale(vdir / "trash");
  return true;  // the lock is released when `lock` closes
}

}  // namespace linac
