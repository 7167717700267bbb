// Tests for runtime/sha256 and runtime/disk_cache: SHA-256 against the FIPS 180-4 / NIST vectors, key
// field separation, round trips, every kind of corrupt entry (detected, counted, removed, rebuilt),
// races between two writers, LRU pruning, clearing, the cache location's environment variables, and a
// cache root that cannot be used. Cross-process races are in tests/python/test_cache_concurrency.py.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "linac/error.h"
#include "runtime/disk_cache.h"
#include "runtime/sha256.h"

namespace fs = std::filesystem;
using namespace linac;

namespace {

// A fresh directory per test case, removed at the end of it.
struct TempDir {
  fs::path dir;
  TempDir() {
    static int counter = 0;
    dir = fs::temp_directory_path() /
          ("linac_cache_test." + std::to_string(::getpid()) + "." + std::to_string(counter++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir, ec);
  }
};

// Sets (or, with nullopt, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  std::fclose(f);
}

std::string read_bytes(const fs::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

std::string key_for(const std::string& name) {
  return CacheKey().add("test", name).hex();
}

fs::path entry_path(const fs::path& root, const std::string& key) {
  return root / "v1" / key.substr(0, 2) / key;
}

// Options that ignore the developer's environment.
DiskCacheOptions quiet() {
  return DiskCacheOptions{};
}

// A kernel-like entry with binary data: NUL bytes, every byte value, and an empty file.
CacheEntry sample_entry(const std::string& tag = "") {
  CacheEntry e;
  std::string cubin;
  for (int i = 0; i < 3000; ++i) cubin.push_back(static_cast<char>((i * 37 + 11) & 0xff));
  cubin += std::string("\0\0\0tail\0", 8);
  e.files["kernel.cubin"] = cubin;
  e.files["kernel.ptx"] = "// ptx " + tag + "\n.version 8.5\n.target sm_90a\n";
  e.files["kernel.tir"] = "";
  e.files["meta.json"] = R"({"kernel": "linear_attn_fwd", "tag": ")" + tag + "\"}";
  return e;
}

size_t count_children(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return 0;
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

}  // namespace

// --- SHA-256 ---------------------------------------------------------------------------------------------

TEST_CASE("sha256: FIPS 180-4 / NIST vectors") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256: padding boundaries (values from Python's hashlib)") {
  CHECK(sha256_hex(std::string(55, 'a')) == "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  CHECK(sha256_hex(std::string(56, 'a')) == "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  CHECK(sha256_hex(std::string(63, 'a')) == "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34");
  CHECK(sha256_hex(std::string(64, 'a')) == "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
  CHECK(sha256_hex(std::string(65, 'a')) == "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0");
  CHECK(sha256_hex(std::string(119, 'a')) == "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb");
  CHECK(sha256_hex(std::string(120, 'a')) == "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c");
}

TEST_CASE("sha256: incremental updates in any chunking equal one update") {
  std::string data;
  for (int rep = 0; rep < 5; ++rep)
    for (int b = 0; b < 256; ++b) data.push_back(static_cast<char>(b));
  const std::string expected = "d414b085826eb06778483ba35564dc849e643359f69ed9747878ba6e54985bed";
  CHECK(sha256_hex(data) == expected);
  for (size_t chunk : {1, 3, 63, 64, 65, 100, 1279}) {
    Sha256 h;
    for (size_t i = 0; i < data.size(); i += chunk) h.update(std::string_view(data).substr(i, chunk));
    CHECK_MESSAGE(to_hex(h.finish()) == expected, "chunk " << chunk);
  }
}

// --- CacheKey --------------------------------------------------------------------------------------------

TEST_CASE("cache key: length-prefixed fields do not run together") {
  const std::string k = CacheKey().add("ab", "c").hex();
  CHECK(k.size() == 64);
  CHECK(k.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(k == CacheKey().add("ab", "c").hex());
  CHECK(k != CacheKey().add("a", "bc").hex());
  CHECK(k != CacheKey().add("abc", "").hex());
  CHECK(CacheKey().add("x", "ab").add("y", "c").hex() != CacheKey().add("x", "a").add("y", "bc").hex());
  CHECK(CacheKey().add("a", "").hex() != CacheKey().add("", "a").hex());
  CHECK(CacheKey().add("a", "1").add("b", "2").hex() != CacheKey().add("b", "2").add("a", "1").hex());
  CHECK(CacheKey().add("ir", std::string("a\0b", 3)).hex() != CacheKey().add("ir", std::string("a\0c", 3)).hex());
  CHECK(CacheKey().hex() != CacheKey().add("", "").hex());
}

TEST_CASE("cache key: hex() does not consume the builder") {
  CacheKey key;
  key.add("version", "1");
  const std::string first = key.hex();
  CHECK(key.hex() == first);
  key.add("target", "sm_90a");
  CHECK(key.hex() != first);
  CHECK(key.hex() == CacheKey().add("version", "1").add("target", "sm_90a").hex());
}

// --- put / get -------------------------------------------------------------------------------------------

TEST_CASE("disk cache: put/get round trip of binary data") {
  TempDir tmp;
  DiskCache cache(tmp.dir / "cache", quiet());
  const std::string key = key_for("roundtrip");
  const CacheEntry entry = sample_entry("rt");
  cache.put(key, entry);
  CHECK(cache.stats().puts == 1);

  auto got = cache.get(key);
  REQUIRE(got.has_value());
  CHECK(got->files == entry.files);
  CHECK(got->files.at("kernel.cubin").size() == 3008);
  CHECK(cache.stats().hits == 1);
  CHECK(cache.stats().misses == 0);

  // Another DiskCache object (as another process would) sees the same entry; counters are per object.
  DiskCache other(tmp.dir / "cache", quiet());
  auto again = other.get(key);
  REQUIRE(again.has_value());
  CHECK(again->files == entry.files);
  CHECK(other.stats().hits == 1);
  CHECK(cache.stats().hits == 1);

  // On disk: every file, a MANIFEST, and no staging or trash leftovers.
  const fs::path dir = entry_path(tmp.dir / "cache", key);
  CHECK(read_bytes(dir / "kernel.cubin") == entry.files.at("kernel.cubin"));
  CHECK(fs::is_regular_file(dir / "MANIFEST"));
  CHECK(count_children(tmp.dir / "cache" / "v1" / "tmp") == 0);
  CHECK(count_children(tmp.dir / "cache" / "v1" / "trash") == 0);
}

TEST_CASE("disk cache: an empty entry round-trips") {
  TempDir tmp;
  DiskCache cache(tmp.dir, quiet());
  cache.put(key_for("empty"), CacheEntry{});
  auto got = cache.get(key_for("empty"));
  REQUIRE(got.has_value());
  CHECK(got->files.empty());
}

TEST_CASE("disk cache: an absent key is a miss, and get() creates nothing") {
  TempDir tmp;
  DiskCache cache(tmp.dir / "not-yet", quiet());
  CHECK_FALSE(cache.get(key_for("absent")).has_value());
  CHECK(cache.stats().misses == 1);
  CHECK(cache.stats().hits == 0);
  CHECK_FALSE(fs::exists(tmp.dir / "not-yet"));

  cache.put(key_for("present"), sample_entry());
  CHECK_FALSE(cache.get(key_for("absent")).has_value());
  CHECK(cache.stats().misses == 2);
}

TEST_CASE("disk cache: a second put of the same key keeps the first entry") {
  TempDir tmp;
  DiskCache a(tmp.dir, quiet());
  DiskCache b(tmp.dir, quiet());
  const std::string key = key_for("race");
  a.put(key, sample_entry("first"));
  b.put(key, sample_entry("second"));
  CHECK(b.stats().puts == 1);
  CHECK(b.stats().lost_races == 1);
  auto got = b.get(key);
  REQUIRE(got.has_value());
  CHECK(got->files.at("meta.json").find("first") != std::string::npos);
  CHECK(count_children(tmp.dir / "v1" / "tmp") == 0);
}

TEST_CASE("disk cache: a put over a corrupt entry replaces it") {
  TempDir tmp;
  DiskCache cache(tmp.dir, quiet());
  const std::string key = key_for("replace");
  cache.put(key, sample_entry("old"));
  write_bytes(entry_path(tmp.dir, key) / "kernel.ptx", "garbage");
  cache.put(key, sample_entry("new"));
  CHECK(cache.stats().lost_races == 0);
  auto got = cache.get(key);
  REQUIRE(got.has_value());
  CHECK(got->files == sample_entry("new").files);
  CHECK(count_children(tmp.dir / "v1" / "trash") == 0);
}

TEST_CASE("disk cache: corrupt entries are misses, counted, removed, and rebuilt") {
  TempDir tmp;
  DiskCache cache(tmp.dir, quiet());
  const std::string key = key_for("corrupt");
  const fs::path dir = entry_path(tmp.dir, key);
  cache.put(key, sample_entry());
  REQUIRE(fs::is_directory(dir));

  auto flip_byte = [](const fs::path& p, size_t at) {
    std::string s = read_bytes(p);
    REQUIRE(at < s.size());
    s[at] = static_cast<char>(s[at] ^ 0x01);
    write_bytes(p, s);
  };

  SUBCASE("a truncated file") {
    const std::string s = read_bytes(dir / "kernel.cubin");
    write_bytes(dir / "kernel.cubin", s.substr(0, s.size() / 2));
  }
  SUBCASE("a flipped byte") {
    flip_byte(dir / "kernel.cubin", 1234);
  }
  SUBCASE("a flipped byte in the MANIFEST") {
    flip_byte(dir / "MANIFEST", 40);
  }
  SUBCASE("a missing MANIFEST") {
    fs::remove(dir / "MANIFEST");
  }
  SUBCASE("a garbage MANIFEST") {
    write_bytes(dir / "MANIFEST", std::string("\x7f"
                                              "ELF\0\0garbage\n",
                                              14));
  }
  SUBCASE("a truncated MANIFEST") {
    const std::string s = read_bytes(dir / "MANIFEST");
    write_bytes(dir / "MANIFEST", s.substr(0, s.size() - 4));
  }
  SUBCASE("an empty MANIFEST") {
    write_bytes(dir / "MANIFEST", "");
  }
  SUBCASE("a missing file") {
    fs::remove(dir / "kernel.ptx");
  }
  SUBCASE("a file replaced by a directory") {
    fs::remove(dir / "kernel.tir");
    fs::create_directory(dir / "kernel.tir");
  }
  SUBCASE("a regular file where the entry directory should be") {
    fs::remove_all(dir);
    write_bytes(dir, "not a directory");
  }

  CHECK_FALSE(cache.get(key).has_value());
  CHECK(cache.stats().corrupt_entries == 1);
  CHECK(cache.stats().misses == 1);
  CHECK(cache.stats().hits == 0);
  CHECK_FALSE(fs::exists(dir));
  CHECK(count_children(tmp.dir / "v1" / "trash") == 0);

  // The caller rebuilds and puts again; now it is a hit.
  cache.put(key, sample_entry());
  auto got = cache.get(key);
  REQUIRE(got.has_value());
  CHECK(got->files == sample_entry().files);
  CHECK(cache.stats().corrupt_entries == 1);
}

TEST_CASE("disk cache: malformed keys and file names are internal errors") {
  TempDir tmp;
  DiskCache cache(tmp.dir, quiet());
  CHECK_THROWS_AS(cache.get("../../etc"), InternalError);
  CHECK_THROWS_AS(cache.get(std::string(64, 'G')), InternalError);
  CHECK_THROWS_AS(cache.put("abc", CacheEntry{}), InternalError);
  for (const char* bad : {"", "MANIFEST", "../x", "a/b", ".hidden", "with space", "new\nline"}) {
    CacheEntry e;
    e.files[bad] = "x";
    CHECK_THROWS_AS(cache.put(key_for("names"), e), InternalError);
  }
  CHECK_FALSE(fs::exists(entry_path(tmp.dir, key_for("names"))));
}

TEST_CASE("disk cache: LINAC_DISABLE_CACHE makes get() miss and put() a no-op") {
  TempDir tmp;
  {
    ScopedEnv on("LINAC_DISABLE_CACHE", "1");
    CHECK(DiskCacheOptions::from_env().disabled);
  }
  {
    ScopedEnv off("LINAC_DISABLE_CACHE", "0");
    CHECK_FALSE(DiskCacheOptions::from_env().disabled);
  }
  {
    ScopedEnv unset("LINAC_DISABLE_CACHE", std::nullopt);
    CHECK_FALSE(DiskCacheOptions::from_env().disabled);
  }

  const std::string key = key_for("disabled");
  DiskCache enabled(tmp.dir, quiet());
  enabled.put(key, sample_entry());
  DiskCacheOptions opts;
  opts.disabled = true;
  DiskCache disabled(tmp.dir, opts);
  CHECK_FALSE(disabled.get(key).has_value());
  CHECK(disabled.stats().misses == 1);
  disabled.put(key_for("other"), sample_entry());
  CHECK(disabled.stats().puts == 0);
  CHECK_FALSE(fs::exists(entry_path(tmp.dir, key_for("other"))));
}

// --- management ------------------------------------------------------------------------------------------

TEST_CASE("disk cache: list() reports entries, files, sizes and meta.json") {
  TempDir tmp;
  DiskCache cache(tmp.dir, quiet());
  CHECK(cache.list().empty());
  cache.put(key_for("one"), sample_entry("one"));
  CacheEntry plain;
  plain.files["kernel.ptx"] = "ptx";
  cache.put(key_for("two"), plain);

  const auto entries = cache.list();
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].key < entries[1].key);
  for (const EntryInfo& e : entries) {
    const fs::path dir = entry_path(tmp.dir, e.key);
    uint64_t size = 0;
    for (const auto& f : fs::directory_iterator(dir)) size += fs::file_size(f.path());
    CHECK(e.size_bytes == size);
    if (e.key == key_for("one")) {
      CHECK(e.files == std::vector<std::string>{"kernel.cubin", "kernel.ptx", "kernel.tir", "meta.json"});
      REQUIRE(e.meta_json.has_value());
      CHECK(*e.meta_json == sample_entry("one").files.at("meta.json"));
    } else {
      CHECK(e.files == std::vector<std::string>{"kernel.ptx"});
      CHECK_FALSE(e.meta_json.has_value());
    }
  }
}

TEST_CASE("disk cache: clear() removes every entry") {
  TempDir tmp;
  DiskCache cache(tmp.dir, quiet());
  CHECK(cache.clear() == 0);
  for (const char* name : {"a", "b", "c"}) cache.put(key_for(name), sample_entry(name));
  CHECK(cache.list().size() == 3);
  CHECK(cache.clear() == 3);
  CHECK(cache.list().empty());
  CHECK_FALSE(cache.get(key_for("a")).has_value());
  cache.put(key_for("a"), sample_entry("a"));
  CHECK(cache.get(key_for("a")).has_value());
}

TEST_CASE("disk cache: prune() evicts least recently used entries down to the size limit") {
  TempDir tmp;
  DiskCache cache(tmp.dir, quiet());
  // File times come from a coarse kernel clock (a few ms); sleeping keeps the mtimes distinct.
  auto tick = [] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); };
  for (const char* name : {"a", "b", "c"}) {
    cache.put(key_for(name), sample_entry("same-size"));
    tick();
  }
  REQUIRE(cache.get(key_for("a")).has_value());  // a is now the most recently used
  tick();

  const auto before = cache.list();
  REQUIRE(before.size() == 3);
  const uint64_t entry_size = before[0].size_bytes;
  for (const auto& e : before) REQUIRE(e.size_bytes == entry_size);

  SUBCASE("no-op when under the limit") {
    CHECK(cache.prune(3 * entry_size));
    CHECK(cache.list().size() == 3);
  }
  SUBCASE("keeps the two most recently used") {
    CHECK(cache.prune(2 * entry_size + entry_size / 2));
    CHECK(cache.list().size() == 2);
    CHECK(cache.get(key_for("a")).has_value());
    CHECK(cache.get(key_for("c")).has_value());
    CHECK_FALSE(cache.get(key_for("b")).has_value());
    CHECK(cache.stats().corrupt_entries == 0);
  }
  SUBCASE("keeps only the most recently used") {
    CHECK(cache.prune(entry_size));
    const auto after = cache.list();
    REQUIRE(after.size() == 1);
    CHECK(after[0].key == key_for("a"));
  }
  SUBCASE("zero removes everything") {
    CHECK(cache.prune(0));
    CHECK(cache.list().empty());
  }
  SUBCASE("skipped while another process holds the lock") {
    const int fd = ::open((tmp.dir / "v1" / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);  // a separate open file description: it conflicts
    CHECK_FALSE(cache.prune(0));
    CHECK(cache.list().size() == 3);
    ::close(fd);
    CHECK(cache.prune(0));
    CHECK(cache.list().empty());
  }
}

TEST_CASE("disk cache: prune() on a cache that does not exist yet creates nothing") {
  TempDir tmp;
  DiskCache cache(tmp.dir / "nothing", quiet());
  CHECK(cache.prune(0));
  CHECK_FALSE(fs::exists(tmp.dir / "nothing"));
}

// --- location --------------------------------------------------------------------------------------------

TEST_CASE("cache_dir: LINAC_CACHE_DIR, then XDG_CACHE_HOME/linac, then HOME/.cache/linac") {
  ScopedEnv home("HOME", "/home/someone");
  SUBCASE("LINAC_CACHE_DIR wins") {
    ScopedEnv dir("LINAC_CACHE_DIR", "/tmp/my-linac-cache");
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    CHECK(cache_dir() == fs::path("/tmp/my-linac-cache"));
  }
  SUBCASE("a relative LINAC_CACHE_DIR is made absolute") {
    ScopedEnv dir("LINAC_CACHE_DIR", "rel/cache");
    CHECK(cache_dir() == (fs::current_path() / "rel" / "cache").lexically_normal());
  }
  SUBCASE("then XDG_CACHE_HOME") {
    ScopedEnv dir("LINAC_CACHE_DIR", std::nullopt);
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    CHECK(cache_dir() == fs::path("/xdg/linac"));
  }
  SUBCASE("empty variables count as unset") {
    ScopedEnv dir("LINAC_CACHE_DIR", "");
    ScopedEnv xdg("XDG_CACHE_HOME", "");
    CHECK(cache_dir() == fs::path("/home/someone/.cache/linac"));
  }
  SUBCASE("a relative XDG_CACHE_HOME is ignored") {
    ScopedEnv dir("LINAC_CACHE_DIR", std::nullopt);
    ScopedEnv xdg("XDG_CACHE_HOME", "relative");
    CHECK(cache_dir() == fs::path("/home/someone/.cache/linac"));
  }
  SUBCASE("nothing set is a UserError") {
    ScopedEnv dir("LINAC_CACHE_DIR", std::nullopt);
    ScopedEnv xdg("XDG_CACHE_HOME", std::nullopt);
    ScopedEnv no_home("HOME", std::nullopt);
    CHECK_THROWS_AS(cache_dir(), UserError);
  }
}

TEST_CASE("disk cache: an unusable root is a UserError naming the path and LINAC_CACHE_DIR") {
  TempDir tmp;
  write_bytes(tmp.dir / "file", "I am a regular file");
  for (const fs::path& root : {tmp.dir / "file" / "cache", tmp.dir / "file"}) {
    CAPTURE(root);
    DiskCache cache(root, quiet());
    // A lookup just misses; the write that follows a miss reports the problem.
    CHECK_FALSE(cache.get(key_for("x")).has_value());
    std::string message;
    try {
      cache.put(key_for("x"), sample_entry());
    } catch (const UserError& e) {
      message = e.what();
    }
    CHECK(message.find((tmp.dir / "file").string()) != std::string::npos);
    CHECK(message.find("LINAC_CACHE_DIR") != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
  }
  CHECK(read_bytes(tmp.dir / "file") == "I am a regular file");
}
