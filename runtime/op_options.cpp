// The options of an op call: their text form (linac/ops.h, the C ABI, Python) and the op library's
// OpOptions, both ways.
#include <charconv>
#include <cmath>
#include <fmt/format.h>

#include "linac/ops.h"
#include "runtime/op_call.h"

namespace linac {

namespace ops {

Options Options::parse(std::string_view text) {
  Options o;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      throw UserError(fmt::format("options: '{}' is not key=value", item));
    const std::string key(item.substr(0, eq));
    const std::string value(item.substr(eq + 1));
    auto number = [&]() {
      size_t used = 0;
      double x = 0;
      try {
        x = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || !std::isfinite(x))
        throw UserError(fmt::format("options: {}={} is not a finite number", key, value));
      return x;
    };
    auto integer = [&]() {
      int64_t x = 0;
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
      if (ec != std::errc() || p != value.data() + value.size())
        throw UserError(fmt::format("options: {}={} is not an integer", key, value));
      return x;
    };
    auto flag = [&]() {
      const int64_t x = integer();
      if (x != 0 && x != 1) throw UserError(fmt::format("options: {}={} must be 0 or 1", key, value));
      return x == 1;
    };
    if (key == "backward") o.backward = flag();
    else if (key == "recurrent") o.recurrent = flag();
    else if (key == "normalize") o.normalize = flag();
    else if (key == "no_normalize") o.no_normalize = flag();
    else if (key == "l2norm_qk") o.l2norm_qk = flag();
    else if (key == "scale") o.scale = number();
    else if (key == "a") o.a = number();
    else if (key == "b") o.b = number();
    else if (key == "c") o.c = number();
    else if (key == "noise_dropout") o.noise_dropout = number();
    else if (key == "seed") o.seed = static_cast<uint64_t>(integer());
    else if (key == "chunk_size") o.chunk_size = static_cast<int>(integer());
    else o.config[key] = integer();
  }
  return o;
}

}  // namespace ops

ops::Options to_ops_options(const OpOptions& o) {
  ops::Options r;
  r.backward = o.backward, r.recurrent = o.recurrent, r.normalize = o.normalize, r.no_normalize = o.no_normalize;
  r.l2norm_qk = o.l2norm_qk, r.scale = o.scale, r.a = o.a, r.b = o.b, r.c = o.c;
  r.noise_dropout = o.noise_dropout, r.seed = o.seed, r.chunk_size = o.chunk_size, r.config = o.config;
  return r;
}

OpOptions to_op_options(const ops::Options& o) {
  OpOptions r;
  r.backward = o.backward, r.recurrent = o.recurrent, r.normalize = o.normalize, r.no_normalize = o.no_normalize;
  r.l2norm_qk = o.l2norm_qk, r.scale = o.scale, r.a = o.a, r.b = o.b, r.c = o.c;
  r.noise_dropout = o.noise_dropout, r.seed = o.seed, r.chunk_size = o.chunk_size, r.config = o.config;
  return r;
}

}  // namespace linac
