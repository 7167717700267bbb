// linac_cache_stress: one "compiler process" for tests/python/test_cache_concurrency.py. Opens the disk
// cache at argv[1] and looks up a fixed key; on a miss it "compiles" (sleeps 50 ms, so concurrent
// processes overlap, and makes a deterministic 1 MiB blob) and puts the entry. Then it reads the entry
// back and checks every byte. Prints "ok hit" or "ok built" and exits 0; anything else exits non-zero.
// Built as its own executable (it has its own main), not as part of linac_tests.
#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <string>
#include <thread>

#include "runtime/disk_cache.h"

namespace {

constexpr size_t kBlobBytes = size_t{1} << 20;

// Must match expected_blob() in test_cache_concurrency.py. Has NUL bytes and every byte value.
std::string make_blob() {
  std::string blob(kBlobBytes, '\0');
  for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>((i * 131 + (i >> 8) * 7) & 0xff);
  return blob;
}

linac::CacheEntry make_entry() {
  linac::CacheEntry e;
  e.files["blob.bin"] = make_blob();
  e.files["meta.json"] = R"({"kernel": "cache_stress"})";
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: {} <cache-root>\n", argc > 0 ? argv[0] : "linac_cache_stress");
    return 2;
  }
  try {
    linac::DiskCacheOptions options = linac::DiskCacheOptions::from_env();
    options.disabled = false;  // this program tests the cache; a developer's LINAC_DISABLE_CACHE must not skip it
    linac::DiskCache cache(argv[1], options);
    const std::string key = linac::CacheKey().add("program", "linac_cache_stress").add("version", "1").hex();
    const linac::CacheEntry expected = make_entry();

    bool built = false;
    if (!cache.get(key)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      cache.put(key, make_entry());
      built = true;
    }
    auto entry = cache.get(key);
    if (!entry) {
      fmt::print(stderr, "error: entry {} missing right after put\n", key);
      return 1;
    }
    if (entry->files != expected.files) {
      fmt::print(stderr, "error: entry {} does not hold the expected files\n", key);
      return 1;
    }
    fmt::print("ok {}\n", built ? "built" : "hit");
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 3;
  }
}
