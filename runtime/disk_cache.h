// The content-addressed on-disk compile cache (docs/architecture.md, "Runtime").
//
// An entry is a directory of named blobs (tile IR, LLVM IR, PTX, cubin, meta.json) plus a MANIFEST that
// lists every blob's size and SHA-256. Layout under the cache root:
//
//   <root>/v1/<key[0:2]>/<key>/{<files>..., MANIFEST}   installed entries
//   <root>/v1/tmp/<key>.<pid>.<random>/                 staging dirs of put()s in progress
//   <root>/v1/trash/<key>.<pid>.<random>/               entries being deleted
//   <root>/v1/lock                                      flock()ed by prune()
//
// put() writes a whole entry into a staging dir on the same filesystem and installs it with one
// rename(), so readers only ever see complete entries; when two processes race, the first rename wins and
// the loser discards its copy. get() checks every file against the MANIFEST; an entry that fails (a
// crash, a full disk, someone editing files) is a miss, and it is moved to the trash and deleted so the
// caller rebuilds and put()s it again. Corrupt content never throws; only an unusable cache directory
// does (UserError).
//
// Environment (read in cache_dir() and DiskCacheOptions::from_env(), nowhere else):
//   LINAC_CACHE_DIR       the cache root; else $XDG_CACHE_HOME/linac, else $HOME/.cache/linac.
//   LINAC_DISABLE_CACHE=1 get() always misses and put() does nothing (for debugging the compiler).
//   LINAC_CACHE_LOG=1     one line on stderr per hit, miss, corrupt entry and put.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/sha256.h"

namespace linac {

/// The version of the on-disk layout (the "v1" directory). Callers also add it to every CacheKey, so a
/// change in what an entry holds can bump it.
constexpr int kCacheFormatVersion = 1;

/// Builds a cache key: the SHA-256 of a sequence of named fields. Each name and value is hashed with its
/// length in front, so ("ab", "c") and ("a", "bc") give different keys. Callers add, in a fixed order:
/// cache format version, compiler identity, LLVM version, canonical tile IR text, constants, target (sm,
/// ptx version), options and every codegen knob.
class CacheKey {
 public:
  /// Appends one field. Returns *this so fields can be chained.
  CacheKey& add(std::string_view field_name, std::string_view value);
  /// The key: 64 lowercase hex characters. The builder stays usable (more fields give a new key).
  std::string hex() const;

 private:
  Sha256 hash_;
};

/// The cache root: $LINAC_CACHE_DIR, else $XDG_CACHE_HOME/linac, else $HOME/.cache/linac (empty variables
/// count as unset; a relative XDG_CACHE_HOME is ignored, as the XDG spec says). The directory is not
/// created here but by the first put(). Throws UserError when none of the variables is usable.
std::filesystem::path cache_dir();

/// A cache entry: named blobs (binary-safe). Names are plain file names: letters, digits and "._-+", not
/// starting with '.', at most 128 characters, and not "MANIFEST".
struct CacheEntry {
  std::map<std::string, std::string> files;
};

/// What list() reports about one installed entry. It is not verified (list() does not hash files).
struct EntryInfo {
  std::string key;
  uint64_t size_bytes = 0;                      // all files in the entry directory, MANIFEST included
  std::chrono::system_clock::time_point mtime;  // last put() or hit: what prune() orders by
  std::vector<std::string> files;               // sorted, MANIFEST excluded
  std::optional<std::string> meta_json;         // contents of meta.json, if the entry has one
};

/// Behaviour switches; from_env() reads LINAC_DISABLE_CACHE and LINAC_CACHE_LOG.
struct DiskCacheOptions {
  bool disabled = false;  // get() always misses, put() does nothing
  bool log = false;       // one stderr line per hit / miss / corrupt entry / put
  static DiskCacheOptions from_env();
};

/// A snapshot of a DiskCache's counters.
struct DiskCacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;           // includes corrupt entries and lookups while disabled
  uint64_t corrupt_entries = 0;  // entries get() found damaged and removed
  uint64_t puts = 0;             // put() calls that left a good entry in place (ours or a racer's)
  uint64_t lost_races = 0;       // of those, the ones where another process had installed it first
};

/// The on-disk cache at one root. Safe to use from many threads and processes at once; holds no state
/// but its counters.
class DiskCache {
 public:
  explicit DiskCache(std::filesystem::path root, DiskCacheOptions options = DiskCacheOptions::from_env());
  /// The cache at cache_dir().
  static DiskCache open_default() { return DiskCache(cache_dir()); }

  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;
  DiskCache(DiskCache&& other) noexcept;

  const std::filesystem::path& root() const { return root_; }
  const DiskCacheOptions& options() const { return options_; }

  /// The entry for `key` (a CacheKey::hex()), or nullopt on a miss. An entry whose MANIFEST is missing or
  /// garbled or whose files do not match it is counted as corrupt, removed, and reported as a miss. A hit
  /// marks the entry as recently used. Throws UserError only when the cache directory cannot be read.
  std::optional<CacheEntry> get(const std::string& key);

  /// Installs `entry` under `key` atomically. If another process installed the key first, its entry is
  /// kept (the contents of an entry are a function of its key) unless it is corrupt, in which case it is
  /// replaced. Throws UserError naming the directory when the cache cannot be written (unwritable or
  /// invalid root, disk full); InternalError for a malformed key or file name.
  void put(const std::string& key, const CacheEntry& entry);

  /// Every installed entry, sorted by key. Entries that vanish during the scan are left out.
  std::vector<EntryInfo> list() const;

  /// Removes every entry (and leftovers of crashed processes older than an hour). Returns how many
  /// entries were removed. Safe while other processes use the cache: they see misses. UserError naming
  /// the cache and the reason when an entry that is still there could not be removed (no permission).
  size_t clear();

  /// Removes least-recently-used entries until the entries total at most `max_bytes`. Runs under a
  /// non-blocking flock on <root>/v1/lock: if another process holds it, does nothing and returns false.
  bool prune(uint64_t max_bytes);

  DiskCacheStats stats() const;

 private:
  struct Counters {
    std::atomic<uint64_t> hits{0}, misses{0}, corrupt_entries{0}, puts{0}, lost_races{0};
  };

  std::filesystem::path version_dir() const;
  std::filesystem::path entry_dir(const std::string& key) const;

  std::filesystem::path root_;
  DiskCacheOptions options_;
  Counters counters_;
};

}  // namespace linac
