#include "kernels/common/config_schema.h"

#include <fmt/format.h>

#include "linac/error.h"

namespace linac {

std::optional<int64_t> TuningKey::given(const OpOptions& opts) const {
  auto it = opts.config.find(key);
  if (it == opts.config.end()) return std::nullopt;
  for (int64_t a : allowed)
    if (a == it->second) return a;
  throw UserError(fmt::format("--config {}={}: must be one of {}", key, it->second, fmt::join(allowed, ", ")));
}

int64_t TuningKey::value(const OpOptions& opts, int64_t dflt) const {
  return given(opts).value_or(dflt);
}

bool TuningKey::asked(const OpOptions& opts) const {
  return opts.config.count(key) > 0;
}

std::string TuningKey::line() const {
  return fmt::format("{} ({})", help, fmt::join(allowed, ", "));
}

TuningKeys merge_tuning_keys(std::initializer_list<TuningKeys> lists) {
  TuningKeys out;
  for (const auto& list : lists)
    for (const auto& k : list) {
      bool seen = false;
      for (const auto& o : out) seen |= o.key == k.key;
      if (!seen) out.push_back(k);
    }
  return out;
}

void check_config_keys(const std::string& op, const OpOptions& opts, const TuningKeys& keys) {
  for (const auto& [key, value] : opts.config) {
    bool known = false;
    for (const auto& k : keys) known |= k.key == key;
    if (!known) {
      std::vector<std::string> names;
      for (const auto& k : keys) names.push_back(k.key);
      throw UserError(fmt::format("{} has no tuning parameter '{}' (known: {})", op, key, fmt::join(names, ", ")));
    }
  }
}

std::vector<std::pair<std::string, std::string>> config_key_lines(const TuningKeys& keys) {
  std::vector<std::pair<std::string, std::string>> lines;
  for (const auto& k : keys) lines.emplace_back(k.key, k.line());
  return lines;
}

TuningKey chunk_key(std::vector<int64_t> allowed) {
  return {"chunk", std::move(allowed), "rows per chunk"};
}
TuningKey bv_key(std::vector<int64_t> allowed) {
  return {"bv", std::move(allowed), "value columns per program"};
}
TuningKey warps_key() {
  return {"warps", {2, 4, 8}, "warps per program"};
}
TuningKey stages_key() {
  return {"stages", {1, 2, 3, 4}, "pipeline stages of the chunk loads (3 and 4: one stage slack, products waited for an iteration late)"};
}
TuningKey producer_key() {
  return {"producer", {0, 4},
          "4: a warpgroup of its own copies the chunk loads with TMA, the others compute (sm_90a; warp "
          "specialisation)"};
}
TuningKey tokenwise_key(std::string help) {
  return {"tokenwise", {0, 1}, std::move(help)};
}

namespace config_schema_detail {

void append_value(std::string& out, int64_t v) {
  out += fmt::format("{}/", v);
}
void append_value(std::string& out, DType v) {
  out += fmt::format("{}/", dtype_name(v));
}
void append_value(std::string& out, const char* v) {
  out += fmt::format("{}/", v ? v : "(none)");
}

}  // namespace config_schema_detail

}  // namespace linac
