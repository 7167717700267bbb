#include "runtime/npy.h"
#include "runtime/output_files.h"

#include "compiler/interp/number_formats.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string_view>

#include "linac/error.h"

namespace linac {
namespace {

// The in-memory layout is the file's layout; a big-endian host would need byte swapping everywhere.
static_assert(std::endian::native == std::endian::little, "linac's .npy I/O assumes a little-endian host");

constexpr std::string_view kMagic{"\x93NUMPY", 6};
// numpy itself refuses headers over 10000 bytes by default; 1 MiB leaves room for hand-made files
// while keeping a corrupt length field from making us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 1 << 20;
// Bytes read per call when the file size is not known up front (pipes, character devices).
constexpr size_t kReadChunk = size_t{64} << 20;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

[[noreturn]] void fail(const std::string& path, std::string_view why) {
  throw UserError(fmt::format("{}: {}", path, why));
}

std::string errno_str(int err) {
  return std::strerror(err);
}

// Header text quoted in a message: bytes from a corrupt file must not break the one-line message or
// the terminal, so anything but printable ASCII is escaped and long text is cut.
std::string printable(std::string_view s) {
  constexpr size_t kMaxShown = 40;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\')
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  if (s.size() > kMaxShown) out += "...";
  return out;
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Parses the header: a Python dict literal with exactly the keys 'descr', 'fortran_order' and
// 'shape', e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }. We parse the literal
// ourselves instead of evaluating anything, and accept only what numpy (any version) writes.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  Header parse() {
    Header h;
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_ws();
    expect('{', "expected '{'");
    for (;;) {
      skip_ws();
      if (eat('}')) break;
      std::string key = parse_string("a quoted key");
      skip_ws();
      expect(':', fmt::format("expected ':' after key '{}'", printable(key)));
      skip_ws();
      if (key == "descr") {
        if (peek() == '[') fail(path_, "structured dtypes are not supported (descr is a list of fields)");
        if (peek() != '\'' && peek() != '"') fail(path_, "unsupported dtype descr (expected a string such as '<f4')");
        h.descr = parse_string("a dtype string");
        have_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = parse_bool();
        have_fortran = true;
      } else if (key == "shape") {
        h.shape = parse_shape();
        have_shape = true;
      } else {
        bad(fmt::format("unexpected key '{}'", printable(key)));
      }
      skip_ws();
      if (eat(',')) continue;
      skip_ws();
      expect('}', "expected ',' or '}' after a value");
      break;
    }
    skip_ws();
    if (pos_ != s_.size()) bad("unexpected text after '}'");
    if (!have_descr) bad("missing key 'descr'");
    if (!have_fortran) bad("missing key 'fortran_order'");
    if (!have_shape) bad("missing key 'shape'");
    return h;
  }

 private:
  [[noreturn]] void bad(std::string_view why) { fail(path_, fmt::format("malformed .npy header: {}", why)); }

  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool eat(char c) {
    if (pos_ >= s_.size() || s_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c, std::string_view why) {
    if (!eat(c)) bad(why);
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  std::string parse_string(std::string_view what) {
    char q = peek();
    if (q != '\'' && q != '"') bad(fmt::format("expected {}", what));
    ++pos_;
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
      out += s_[pos_++];
    }
    if (pos_ >= s_.size()) bad("unterminated string");
    ++pos_;
    return out;
  }

  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    bad("fortran_order must be True or False");
  }

  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    expect('(', "shape must be a tuple");
    for (;;) {
      skip_ws();
      if (eat(')')) break;
      if (peek() == '-') bad("negative dimension in shape");
      if (peek() < '0' || peek() > '9') bad("shape must be a tuple of integers");
      int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) bad("dimension too large");
        v = v * 10 + (s_[pos_++] - '0');
      }
      eat('L');  // Python 2 era numpy wrote long literals such as 3L
      shape.push_back(v);
      skip_ws();
      if (eat(',')) continue;
      expect(')', "expected ',' or ')' in shape");
      break;
    }
    return shape;
  }

  std::string_view s_;
  const std::string& path_;
  size_t pos_ = 0;
};

DType dtype_from_descr(const std::string& path, const std::string& descr) {
  const std::string d = printable(descr);
  if (d == "<f4") return DType::f32;
  if (d == "<f8") return DType::f64;
  if (d == "<f2") return DType::f16;
  if (d == "<i4") return DType::i32;
  if (d == "<i8") return DType::i64;
  if (d == "|b1") return DType::i1;
  if (!d.empty() && d[0] == '>')
    fail(path, fmt::format("big-endian dtype '{}' is not supported; save it as little-endian "
                           "(arr.astype(arr.dtype.newbyteorder('<')))",
                           d));
  const char kind = d.size() >= 2 ? d[1] : '\0';
  if (kind == 'O') fail(path, fmt::format("object arrays are not supported (dtype '{}')", d));
  if (kind == 'V') fail(path, fmt::format("structured/void dtypes are not supported (dtype '{}')", d));
  fail(path, fmt::format("unsupported dtype '{}' (supported: <f2, <f4, <f8, <i4, <i8, |b1)", d));
}

std::string_view descr_of(DType t) {
  switch (t) {
    case DType::f16:
      return "<f2";
    case DType::f32:
      return "<f4";
    case DType::f64:
      return "<f8";
    case DType::i32:
      return "<i4";
    case DType::i64:
      return "<i8";
    case DType::i1:
      return "|b1";
    case DType::bf16:
      return "";
  }
  throw InternalError("bad dtype");
}

// numel and byte size of a shape, or nullopt-like false when they overflow int64.
bool checked_size(std::span<const int64_t> shape, DType t, int64_t& numel, int64_t& nbytes) {
  numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) return false;
  }
  return !__builtin_mul_overflow(numel, int64_t{dtype_bytes(t)}, &nbytes);
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

double load_f64(DType t, const uint8_t* base, int64_t i) {
  switch (t) {
    case DType::i1:
      return base[i] != 0 ? 1.0 : 0.0;
    case DType::i32:
      return load<int32_t>(base + 4 * i);
    case DType::i64:
      return static_cast<double>(load<int64_t>(base + 8 * i));
    case DType::f16:
      return f16_bits_to_f64(load<uint16_t>(base + 2 * i));
    case DType::bf16:
      return bf16_bits_to_f64(load<uint16_t>(base + 2 * i));
    case DType::f32:
      return load<float>(base + 4 * i);
    case DType::f64:
      return load<double>(base + 8 * i);
  }
  throw InternalError("bad dtype");
}

int64_t load_i64(DType t, const uint8_t* base, int64_t i) {
  switch (t) {
    case DType::i1:
      return base[i] != 0 ? 1 : 0;
    case DType::i32:
      return load<int32_t>(base + 4 * i);
    case DType::i64:
      return load<int64_t>(base + 8 * i);
    default:
      throw InternalError("load_i64 on a float dtype");
  }
}

void store_f64(DType t, uint8_t* base, int64_t i, double v) {
  switch (t) {
    case DType::f16:
      return store<uint16_t>(base + 2 * i, f64_to_f16_bits(v));
    case DType::bf16:
      return store<uint16_t>(base + 2 * i, f64_to_bf16_bits(v));
    case DType::f32:
      return store<float>(base + 4 * i, static_cast<float>(v));
    case DType::f64:
      return store<double>(base + 8 * i, v);
    default:
      throw InternalError("store_f64 on an integer dtype");
  }
}

void store_i64(DType t, uint8_t* base, int64_t i, int64_t v) {
  switch (t) {
    case DType::i1:
      base[i] = v != 0 ? 1 : 0;
      return;
    case DType::i32:
      return store<int32_t>(base + 4 * i, static_cast<int32_t>(v));
    case DType::i64:
      return store<int64_t>(base + 8 * i, v);
    default:
      throw InternalError("store_i64 on a float dtype");
  }
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// One implementation of the 16-bit formats, shared with the interpreter and HostTensor.
double f16_bits_to_f64(uint16_t h) { return interp::from_f16_bits(h); }
uint16_t f64_to_f16_bits(double x) { return interp::f16_bits(x); }
double bf16_bits_to_f64(uint16_t h) { return interp::from_bf16_bits(h); }
uint16_t f64_to_bf16_bits(double x) { return interp::bf16_bits(x); }

NpyArray read_npy(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT) fail(path, "no such file");
    fail(path, fmt::format("cannot open: {}", errno_str(err)));
  }
  if (S_ISDIR(st.st_mode)) fail(path, "is a directory, not a .npy file");
  File f{std::fopen(path.c_str(), "rb")};
  if (!f) fail(path, fmt::format("cannot open: {}", errno_str(errno)));

  auto read_exact = [&](void* dst, size_t n) { return std::fread(dst, 1, n, f.get()) == n; };
  auto read_error = [&]() -> std::string {
    return std::ferror(f.get()) ? fmt::format(" (read error: {})", errno_str(errno)) : std::string();
  };

  unsigned char pre[8];
  size_t got = std::fread(pre, 1, sizeof pre, f.get());
  if (std::ferror(f.get())) fail(path, fmt::format("read error: {}", errno_str(errno)));
  if (got == 0) fail(path, "empty file, not a .npy file");
  if (got < kMagic.size() || std::memcmp(pre, kMagic.data(), kMagic.size()) != 0)
    fail(path, "not a .npy file (bad magic; expected \\x93NUMPY)");
  if (got < sizeof pre) fail(path, "truncated header (file ends inside the format version)");
  const int major = pre[6], minor = pre[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    fail(path, fmt::format("unsupported .npy format version {}.{} (supported: 1.0, 2.0, 3.0)", major, minor));

  uint64_t header_len = 0;
  const size_t len_bytes = major == 1 ? 2 : 4;
  unsigned char lenb[4] = {0, 0, 0, 0};
  if (!read_exact(lenb, len_bytes)) fail(path, "truncated header (file ends inside the header length)" + read_error());
  for (size_t i = 0; i < len_bytes; ++i) header_len |= static_cast<uint64_t>(lenb[i]) << (8 * i);
  if (header_len > kMaxHeaderBytes)
    fail(path, fmt::format("header length {} is implausible (over {} bytes); the file is corrupt", header_len,
                           kMaxHeaderBytes));
  std::string text(header_len, '\0');
  if (!read_exact(text.data(), text.size()))
    fail(path, fmt::format("truncated header (expected {} header bytes){}", header_len, read_error()));

  Header h = HeaderParser(text, path).parse();
  const DType dtype = dtype_from_descr(path, h.descr);
  if (h.fortran_order)
    fail(path, "fortran_order=True arrays are not supported; save a C-order array (np.ascontiguousarray)");

  int64_t numel = 0, nbytes = 0;
  if (!checked_size(h.shape, dtype, numel, nbytes) ||
      static_cast<uint64_t>(nbytes) > std::numeric_limits<size_t>::max())
    fail(path, fmt::format("shape {} is too large", shape_str(h.shape)));

  const int64_t data_start = static_cast<int64_t>(8 + len_bytes + header_len);
  auto truncated = [&](int64_t have) {
    fail(path, fmt::format("truncated data: shape {} of {} needs {} bytes, file has {}", shape_str(h.shape),
                           dtype_name(dtype), nbytes, have));
  };
  const bool sized = S_ISREG(st.st_mode);
  if (sized) {
    const int64_t have = static_cast<int64_t>(st.st_size) - data_start;
    if (have < nbytes) truncated(have);
    if (have > nbytes) fail(path, fmt::format("{} unexpected bytes after the data (file corrupt?)", have - nbytes));
  }

  NpyArray a;
  a.dtype = dtype;
  a.shape = std::move(h.shape);
  try {
    // Grow in chunks when the size is unknown so a lying header cannot make us allocate it all.
    size_t done = 0;
    const size_t total = static_cast<size_t>(nbytes);
    while (done < total) {
      const size_t step = sized ? total - done : std::min(kReadChunk, total - done);
      a.data.resize(done + step);
      const size_t n = std::fread(a.data.data() + done, 1, step, f.get());
      done += n;
      if (n != step) {
        if (std::ferror(f.get())) fail(path, fmt::format("read error: {}", errno_str(errno)));
        truncated(static_cast<int64_t>(done));
      }
    }
  } catch (const std::bad_alloc&) {
    fail(path, fmt::format("out of memory reading {} bytes", nbytes));
  }
  if (!sized && std::fgetc(f.get()) != EOF) fail(path, "unexpected bytes after the data (file corrupt?)");
  return a;
}

void write_npy_to(std::FILE* f, const NpyArray& a, const std::string& path) {
  if (a.dtype == DType::bf16) fail(path, "numpy has no bf16 dtype; convert the array to f32 before writing");
  int64_t numel = 0, nbytes = 0;
  LINAC_INTERNAL_CHECK(checked_size(a.shape, a.dtype, numel, nbytes), "write_npy: bad shape " + shape_str(a.shape));
  LINAC_INTERNAL_CHECK(static_cast<int64_t>(a.data.size()) == nbytes,
                       fmt::format("write_npy: {} data bytes for shape {} of {}", a.data.size(), shape_str(a.shape),
                                   dtype_name(a.dtype)));

  std::string tuple =
      a.shape.size() == 1 ? fmt::format("({},)", a.shape[0]) : fmt::format("({})", fmt::join(a.shape, ", "));
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr_of(a.dtype), tuple);
  // numpy pads the header with spaces and a final newline so the data starts 64-byte aligned.
  int major = 1;
  size_t prefix = 10;
  if (dict.size() + 1 + 63 > 0xffff) {
    major = 2;
    prefix = 12;
  }
  const size_t pad = (64 - (prefix + dict.size() + 1) % 64) % 64;
  std::string header = dict + std::string(pad, ' ') + '\n';

  std::string out(kMagic);
  out += static_cast<char>(major);
  out += '\0';
  const size_t hl = header.size();
  for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((hl >> (8 * i)) & 0xff);
  out += header;

  write_bytes(f, out.data(), out.size(), path);
  write_bytes(f, a.data.data(), a.data.size(), path);
}

void write_npy(const std::string& path, const NpyArray& a) {
  if (a.dtype == DType::bf16) fail(path, "numpy has no bf16 dtype; convert the array to f32 before writing");
  OutputFiles out;
  out.add(path, [&](std::FILE* f, const std::string& p) { write_npy_to(f, a, p); });
  out.commit();
}

NpyArray make_npy(DType dtype, std::vector<int64_t> shape) {
  int64_t numel = 0, nbytes = 0;
  if (!checked_size(shape, dtype, numel, nbytes)) throw UserError(fmt::format("bad array shape {}", shape_str(shape)));
  NpyArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.data.assign(static_cast<size_t>(nbytes), 0);
  return a;
}

namespace {
template <typename T>
NpyArray from_raw(DType t, std::vector<int64_t> shape, const T* data) {
  NpyArray a = make_npy(t, std::move(shape));
  if (!a.data.empty()) std::memcpy(a.data.data(), data, a.data.size());
  return a;
}
}  // namespace

NpyArray from_f32(std::vector<int64_t> shape, const float* data) {
  return from_raw(DType::f32, std::move(shape), data);
}
NpyArray from_f64(std::vector<int64_t> shape, const double* data) {
  return from_raw(DType::f64, std::move(shape), data);
}
NpyArray from_i32(std::vector<int64_t> shape, const int32_t* data) {
  return from_raw(DType::i32, std::move(shape), data);
}
NpyArray from_i64(std::vector<int64_t> shape, const int64_t* data) {
  return from_raw(DType::i64, std::move(shape), data);
}

std::vector<double> to_f64(const NpyArray& a) {
  const int64_t n = a.numel();
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = load_f64(a.dtype, a.data.data(), i);
  return out;
}

std::vector<float> to_f32(const NpyArray& a) {
  const int64_t n = a.numel();
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(load_f64(a.dtype, a.data.data(), i));
  return out;
}

std::vector<int64_t> to_i64(const NpyArray& a) {
  if (is_float(a.dtype)) throw UserError(fmt::format("expected an integer array, got dtype {}", dtype_name(a.dtype)));
  const int64_t n = a.numel();
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = load_i64(a.dtype, a.data.data(), i);
  return out;
}

NpyArray convert(const NpyArray& a, DType to) {
  if (a.dtype == to) return a;
  NpyArray out = make_npy(to, a.shape);
  const int64_t n = a.numel();
  const uint8_t* src = a.data.data();
  uint8_t* dst = out.data.data();
  if (is_int(a.dtype)) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = load_i64(a.dtype, src, i);
      if (is_int(to))
        store_i64(to, dst, i, v);
      else
        store_f64(to, dst, i, static_cast<double>(v));
    }
  } else if (is_float(to)) {
    for (int64_t i = 0; i < n; ++i) store_f64(to, dst, i, load_f64(a.dtype, src, i));
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const double v = load_f64(a.dtype, src, i);
      if (to == DType::i1) {
        store_i64(to, dst, i, v != 0.0 ? 1 : 0);  // numpy's astype(bool): nonzero (and NaN) is true
        continue;
      }
      const double lo = to == DType::i32 ? -2147483648.0 : -9223372036854775808.0;
      const double hi = to == DType::i32 ? 2147483648.0 : 9223372036854775808.0;
      if (!(v >= lo && v < hi) || std::trunc(v) != v)
        throw UserError(fmt::format("cannot convert {} value {} to {}: not an integer in range", dtype_name(a.dtype), v,
                                    dtype_name(to)));
      store_i64(to, dst, i, static_cast<int64_t>(v));
    }
  }
  return out;
}

}  // namespace linac
