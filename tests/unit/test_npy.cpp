// Tests for tools/npy: round trips of every supported dtype, the header versions numpy writes, and
// one test per malformed file, each of which must be a one-line UserError naming the file.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "linac/error.h"
#include "runtime/npy.h"

namespace fs = std::filesystem;
using namespace linac;

namespace {

// A fresh directory per test case, removed at the end of it.
struct TempDir {
  fs::path dir;
  TempDir() {
    static int counter = 0;
    dir =
        fs::temp_directory_path() / ("linac_npy_test." + std::to_string(::getpid()) + "." + std::to_string(counter++));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  std::fclose(f);
}

std::string read_bytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

// A .npy file built by hand: magic, version, little-endian header length, the header dict padded
// with spaces to 64-byte alignment and a newline, then `data`.
std::string npy_bytes(const std::string& dict, const std::string& data, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string f32_bytes(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

// The message of the UserError read_npy(path) throws; fails the test if it throws nothing or
// something else.
std::string read_error(const std::string& path) {
  try {
    read_npy(path);
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected a UserError, got: " << e.what());
    return "";
  }
  FAIL("expected read_npy to fail on " << path);
  return "";
}

// Every file error is one line that starts with the path and contains `needle`.
void check_error(const std::string& path, const std::string& needle) {
  const std::string msg = read_error(path);
  CAPTURE(msg);
  CHECK(msg.rfind(path + ": ", 0) == 0);
  CHECK(msg.find('\n') == std::string::npos);
  CHECK(msg.find(needle) != std::string::npos);
}

template <typename T>
NpyArray array_of(DType t, std::vector<int64_t> shape, const std::vector<T>& values) {
  NpyArray a = make_npy(t, std::move(shape));
  REQUIRE(a.data.size() == values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(a.data.data(), values.data(), a.data.size());
  return a;
}

void check_round_trip(const TempDir& tmp, const NpyArray& a) {
  const std::string path = tmp.file("a.npy");
  write_npy(path, a);
  const std::string raw = read_bytes(path);
  REQUIRE(raw.size() >= 10);
  CHECK((raw.size() - a.data.size()) % 64 == 0);  // data starts 64-byte aligned, as numpy writes it
  NpyArray b = read_npy(path);
  CHECK(b.dtype == a.dtype);
  CHECK(b.shape == a.shape);
  CHECK(b.data == a.data);
  CHECK(!fs::exists(path + ".tmp." + std::to_string(::getpid())));
}

}  // namespace

TEST_CASE("npy: round trip of every supported dtype") {
  TempDir tmp;
  check_round_trip(tmp, array_of<float>(DType::f32, {2, 3}, {1.5f, -2.f, 3.25f, 0.f, -0.f, 1e30f}));
  check_round_trip(tmp, array_of<double>(DType::f64, {3}, {1e-300, -2.5, 3.0}));
  check_round_trip(tmp, array_of<uint16_t>(DType::f16, {2, 2}, {0x3c00, 0xc000, 0x7bff, 0x0001}));
  check_round_trip(tmp, array_of<int32_t>(DType::i32, {4}, {1, -2, 2147483647, -2147483647 - 1}));
  check_round_trip(tmp, array_of<int64_t>(DType::i64, {1, 2}, {int64_t{1} << 40, -7}));
  check_round_trip(tmp, array_of<uint8_t>(DType::i1, {2, 2}, {1, 0, 0, 1}));
  check_round_trip(tmp, array_of<float>(DType::f32, {1, 2, 1, 2, 1}, {1.f, 2.f, 3.f, 4.f}));
}

TEST_CASE("npy: 0-d and empty arrays") {
  TempDir tmp;
  NpyArray scalar = array_of<double>(DType::f64, {}, {42.0});
  CHECK(scalar.numel() == 1);
  check_round_trip(tmp, scalar);
  check_round_trip(tmp, array_of<float>(DType::f32, {0}, {}));
  check_round_trip(tmp, array_of<int64_t>(DType::i64, {3, 0, 2}, {}));
  CHECK(make_npy(DType::f32, {3, 0, 2}).numel() == 0);
  CHECK(to_f64(make_npy(DType::f32, {0})).empty());
}

TEST_CASE("npy: header text matches numpy's") {
  TempDir tmp;
  const std::string path = tmp.file("h.npy");
  write_npy(path, array_of<float>(DType::f32, {3}, {1.f, 2.f, 3.f}));
  const std::string raw = read_bytes(path);
  CHECK(raw.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  CHECK(raw.find("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }") == 10);
  CHECK(raw.size() == 128 + 12);  // same size as np.save writes
  write_npy(path, array_of<double>(DType::f64, {}, {1.0}));
  CHECK(read_bytes(path).find("'shape': (), }") != std::string::npos);
  write_npy(path, make_npy(DType::i1, {2, 3}));
  CHECK(read_bytes(path).find("{'descr': '|b1', 'fortran_order': False, 'shape': (2, 3), }") == 10);
}

TEST_CASE("npy: reads format versions 1.0, 2.0 and 3.0 and numpy header variants") {
  TempDir tmp;
  const std::string path = tmp.file("v.npy");
  for (int major : {1, 2, 3}) {
    CAPTURE(major);
    write_bytes(path,
                npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f32_bytes({1.f, 2.f}), major));
    NpyArray a = read_npy(path);
    CHECK(a.dtype == DType::f32);
    CHECK(a.shape == std::vector<int64_t>{2});
    CHECK(to_f64(a) == std::vector<double>{1.0, 2.0});
  }
  // Key order, double quotes, no trailing comma, Python 2 long literals, 16-byte padding.
  std::string d = "{\"shape\": (1L, 2L), \"fortran_order\": False, \"descr\": \"<f4\"}";
  write_bytes(path, npy_bytes(d, f32_bytes({3.f, 4.f})));
  NpyArray a = read_npy(path);
  CHECK(a.shape == std::vector<int64_t>{1, 2});
  CHECK(to_f32(a) == std::vector<float>{3.f, 4.f});
}

TEST_CASE("npy: missing files, directories and empty files") {
  TempDir tmp;
  check_error(tmp.file("nope.npy"), "no such file");
  check_error(tmp.dir.string(), "is a directory");
  write_bytes(tmp.file("empty.npy"), "");
  check_error(tmp.file("empty.npy"), "empty file");
}

TEST_CASE("npy: bad magic and unsupported versions") {
  TempDir tmp;
  const std::string path = tmp.file("m.npy");
  std::string good = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", f32_bytes({1.f}));
  std::string bad = good;
  bad[5] = 'Z';
  write_bytes(path, bad);
  check_error(path, "bad magic");
  write_bytes(path, "hello world, not numpy at all");
  check_error(path, "bad magic");
  write_bytes(path, "\x93NU");
  check_error(path, "bad magic");
  bad = good;
  bad[6] = 4;
  write_bytes(path, bad);
  check_error(path, "unsupported .npy format version 4.0");
  bad = good;
  bad[7] = 1;
  write_bytes(path, bad);
  check_error(path, "unsupported .npy format version 1.1");
}

TEST_CASE("npy: truncated header") {
  TempDir tmp;
  const std::string path = tmp.file("t.npy");
  const std::string good = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", f32_bytes({1.f}));
  for (size_t cut : {7, 9, 20, 63}) {
    CAPTURE(cut);
    write_bytes(path, good.substr(0, cut));
    check_error(path, "truncated header");
  }
  // A header length field far beyond the file, and beyond any sane header.
  std::string big = good;
  big[8] = '\xff';
  big[9] = '\xff';
  write_bytes(path, big);
  check_error(path, "truncated header");
  std::string v2 = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", f32_bytes({1.f}), 2);
  v2[11] = '\x7f';
  write_bytes(path, v2);
  check_error(path, "implausible");
}

TEST_CASE("npy: truncated and trailing data") {
  TempDir tmp;
  const std::string path = tmp.file("d.npy");
  const std::string good =
      npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", f32_bytes({1.f, 2.f, 3.f, 4.f}));
  write_bytes(path, good.substr(0, good.size() - 1));
  check_error(path, "truncated data: shape [2, 2] of f32 needs 16 bytes, file has 15");
  write_bytes(path, good.substr(0, good.size() - 16));
  check_error(path, "truncated data");
  write_bytes(path, good + "xx");
  check_error(path, "2 unexpected bytes after the data");
  // A shape whose byte count overflows must be refused, not allocated.
  write_bytes(path, npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", ""));
  check_error(path, "too large");
  write_bytes(path, npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (100000000000,), }", ""));
  check_error(path, "truncated data");
}

TEST_CASE("npy: unsupported layouts and dtypes") {
  TempDir tmp;
  const std::string path = tmp.file("u.npy");
  auto with = [&](const std::string& descr, const std::string& fortran = "False") {
    write_bytes(path, npy_bytes("{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': (2, 2), }",
                                f32_bytes({1.f, 2.f, 3.f, 4.f})));
  };
  with("<f4", "True");
  check_error(path, "fortran_order=True arrays are not supported");
  with(">f4");
  check_error(path, "big-endian dtype '>f4' is not supported");
  with(">i8");
  check_error(path, "big-endian");
  with("|O");
  check_error(path, "object arrays are not supported");
  with("|V4");
  check_error(path, "structured/void dtypes are not supported");
  with("<u2");
  check_error(path, "unsupported dtype '<u2'");
  with("<c8");
  check_error(path, "unsupported dtype '<c8'");
  write_bytes(path, npy_bytes("{'descr': [('a', '<f4'), ('b', '<f4')], 'fortran_order': False, 'shape': (2,), }",
                              f32_bytes({1.f, 2.f, 3.f, 4.f})));
  check_error(path, "structured dtypes are not supported");
}

TEST_CASE("npy: malformed headers") {
  TempDir tmp;
  const std::string path = tmp.file("h.npy");
  auto header = [&](const std::string& dict) { write_bytes(path, npy_bytes(dict, f32_bytes({1.f}))); };
  header("{'descr': '<f4', 'shape': (1,), }");
  check_error(path, "missing key 'fortran_order'");
  header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}");
  check_error(path, "unexpected key 'extra'");
  header("{'descr': '<f4', 'fortran_order': maybe, 'shape': (1,), }");
  check_error(path, "fortran_order must be True or False");
  header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }");
  check_error(path, "negative dimension");
  header("{'descr': '<f4', 'fortran_order': False, 'shape': [1], }");
  check_error(path, "shape must be a tuple");
  header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), } junk");
  check_error(path, "unexpected text after");
  header("{'descr: '<f4'");
  check_error(path, "malformed .npy header");
  header("not a dict");
  check_error(path, "malformed .npy header");
  header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }");
  check_error(path, "dimension too large");
}

TEST_CASE("npy: write failures leave no file behind") {
  TempDir tmp;
  NpyArray a = array_of<float>(DType::f32, {1}, {1.f});
  const std::string in_missing_dir = tmp.file("no/such/dir/o.npy");
  CHECK_THROWS_AS(write_npy(in_missing_dir, a), UserError);
  CHECK(!fs::exists(tmp.dir / "no"));
  // Writing onto a directory fails at the rename; the temporary must be cleaned up.
  fs::create_directories(tmp.dir / "d.npy");
  CHECK_THROWS_AS(write_npy(tmp.file("d.npy"), a), UserError);
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.dir)) ++entries;
  CHECK(entries == 1);
  // bf16 has no numpy dtype.
  try {
    write_npy(tmp.file("b.npy"), make_npy(DType::bf16, {2}));
    FAIL("bf16 write must fail");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("bf16") != std::string::npos);
  }
  CHECK(!fs::exists(tmp.file("b.npy")));
  // Data that does not match the shape is a caller bug.
  NpyArray wrong = a;
  wrong.shape = {2};
  CHECK_THROWS_AS(write_npy(tmp.file("w.npy"), wrong), InternalError);
  CHECK(!fs::exists(tmp.file("w.npy")));
  // Overwriting an existing file replaces it.
  write_npy(tmp.file("o.npy"), a);
  write_npy(tmp.file("o.npy"), array_of<float>(DType::f32, {2}, {5.f, 6.f}));
  CHECK(to_f32(read_npy(tmp.file("o.npy"))) == std::vector<float>{5.f, 6.f});
}

TEST_CASE("npy: f16 and bf16 conversions") {
  // Every finite pattern survives bits -> double -> bits; NaNs stay NaN.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double v = f16_bits_to_f64(static_cast<uint16_t>(h));
    if (std::isnan(v)) {
      CHECK(std::isnan(f16_bits_to_f64(f64_to_f16_bits(v))));
    } else if (f64_to_f16_bits(v) != h) {
      FAIL("f16 pattern " << h << " does not round trip");
    }
    const double b = bf16_bits_to_f64(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      CHECK(std::isnan(bf16_bits_to_f64(f64_to_bf16_bits(b))));
    } else if (f64_to_bf16_bits(b) != h) {
      FAIL("bf16 pattern " << h << " does not round trip");
    }
  }
  CHECK(f16_bits_to_f64(0x3c00) == 1.0);
  CHECK(f16_bits_to_f64(0x7bff) == 65504.0);
  CHECK(f16_bits_to_f64(0x0001) == std::ldexp(1.0, -24));
  CHECK(f64_to_f16_bits(1.0 + std::ldexp(1.0, -11)) == 0x3c00);      // tie -> even
  CHECK(f64_to_f16_bits(1.0 + 3 * std::ldexp(1.0, -11)) == 0x3c02);  // tie -> even (up)
  CHECK(f64_to_f16_bits(1.0 + std::ldexp(1.0, -11) + 1e-12) == 0x3c01);
  CHECK(f64_to_f16_bits(65519.0) == 0x7bff);
  CHECK(f64_to_f16_bits(65520.0) == 0x7c00);
  CHECK(f64_to_f16_bits(-1e10) == 0xfc00);
  CHECK(f64_to_f16_bits(std::ldexp(1.0, -25)) == 0x0000);  // tie between 0 and the smallest subnormal
  CHECK(f64_to_f16_bits(std::ldexp(1.5, -25)) == 0x0001);
  CHECK(f64_to_f16_bits(std::ldexp(1023.5, -24)) == 0x0400);  // rounds up into the smallest normal
  CHECK(f64_to_f16_bits(-0.0) == 0x8000);
  CHECK(f64_to_bf16_bits(1.0) == 0x3f80);
  CHECK(f64_to_bf16_bits(1.0 + std::ldexp(1.0, -8)) == 0x3f80);
  CHECK(f64_to_bf16_bits(1.0 + 3 * std::ldexp(1.0, -8)) == 0x3f82);
  CHECK(f64_to_bf16_bits(std::numeric_limits<double>::max()) == 0x7f80);
  CHECK(bf16_bits_to_f64(0xc040) == -3.0);
}

TEST_CASE("npy: convert and element helpers") {
  NpyArray f = array_of<float>(DType::f32, {4}, {1.0f, -2.5f, 1.0f + 1.0f / 2048, 70000.f});
  NpyArray h = convert(f, DType::f16);
  CHECK(h.dtype == DType::f16);
  CHECK(h.shape == f.shape);
  CHECK(to_f64(h) == std::vector<double>{1.0, -2.5, 1.0, std::numeric_limits<double>::infinity()});
  NpyArray b = convert(f, DType::bf16);
  CHECK(to_f64(b)[1] == -2.5);
  CHECK(to_f64(convert(b, DType::f32))[0] == 1.0);

  NpyArray i = array_of<int32_t>(DType::i32, {3}, {0, 5, -7});
  CHECK(to_i64(i) == std::vector<int64_t>{0, 5, -7});
  CHECK(to_i64(convert(i, DType::i64)) == std::vector<int64_t>{0, 5, -7});
  CHECK(to_f64(convert(i, DType::f64)) == std::vector<double>{0.0, 5.0, -7.0});
  CHECK(to_i64(convert(i, DType::i1)) == std::vector<int64_t>{0, 1, 1});
  CHECK_THROWS_AS(to_i64(f), UserError);
  CHECK(to_i64(convert(array_of<double>(DType::f64, {2}, {3.0, -4.0}), DType::i32)) == std::vector<int64_t>{3, -4});
  CHECK_THROWS_AS(convert(f, DType::i32), UserError);  // -2.5 is not an integer
  CHECK_THROWS_AS(convert(array_of<double>(DType::f64, {1}, {3e9}), DType::i32), UserError);

  const float raw[] = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  NpyArray r = from_f32({2, 3}, raw);
  CHECK(r.numel() == 6);
  CHECK(to_f32(r) == std::vector<float>(raw, raw + 6));
  const int64_t cu[] = {0, 1, 17};
  CHECK(to_i64(from_i64({3}, cu)) == std::vector<int64_t>{0, 1, 17});
  const int32_t cu32[] = {0, 4};
  CHECK(to_i64(from_i32({2}, cu32)) == std::vector<int64_t>{0, 4});
  const double d[] = {0.5};
  CHECK(to_f64(from_f64({}, d)) == std::vector<double>{0.5});
  CHECK(shape_str(std::vector<int64_t>{2, 3}) == "[2, 3]");
  CHECK(shape_str(std::vector<int64_t>{}) == "[]");
}
