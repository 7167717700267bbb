// A kernel configuration described once. Each family's *Config struct (the compile-time parameters of
// its kernels) gets one ConfigSchema listing every field, and for the fields a user may tune, the
// `--config` key, the values it may take and a line of help. From that one list come:
//   - the memo key (ConfigSchema::key): every field, so no field can be left out of it: the schema
//     refuses to compile unless it lists as many fields as the struct has;
//   - `--config` checking and applying (check_config_keys, ConfigSchema::apply);
//   - the cfg lines of `linac list` (config_key_lines into OpDef::config_keys);
//   - the tuner's deduplication, which compares the kernels candidates resolve to (equal configurations
//     give equal keys, so the same memoized kernel).
// Defaults are not part of it: an op sets them on its struct, then applies the user's --config on top.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/op.h"
#include "linac/dtype.h"

namespace linac {

/// A tuning parameter: `--config key=value`, value one of `allowed`. It changes speed, never results
/// beyond rounding.
struct TuningKey {
  std::string key;
  std::vector<int64_t> allowed;
  std::string help;  // what it sets; `linac list` appends the allowed values

  /// opts.config[key] if given (UserError unless one of `allowed`), else nothing.
  std::optional<int64_t> given(const OpOptions& opts) const;
  /// opts.config[key] if given (checked as above), else `dflt`: for keys that choose a schedule rather
  /// than set a field.
  int64_t value(const OpOptions& opts, int64_t dflt) const;
  /// Whether opts.config gives this key at all (its value is checked where it is applied): for
  /// defaults that change when the user asks for a value.
  bool asked(const OpOptions& opts) const;
  /// The help with the allowed values, e.g. "warps per program (2, 4, 8)".
  std::string line() const;
};

/// The tuning parameters one form of an op accepts.
using TuningKeys = std::vector<TuningKey>;

/// Every key of `lists`, each once (the first list that has a key describes it), in order.
TuningKeys merge_tuning_keys(std::initializer_list<TuningKeys> lists);
/// UserError naming `op` and the known keys unless every key of opts.config is one of `keys`.
void check_config_keys(const std::string& op, const OpOptions& opts, const TuningKeys& keys);
/// `keys` as OpDef::config_keys (key, help with the allowed values): `linac list`'s cfg lines.
std::vector<std::pair<std::string, std::string>> config_key_lines(const TuningKeys& keys);

namespace config_schema_detail {

/// Converts to anything: counts the fields of an aggregate (how many initializers it takes).
struct AnyValue {
  template <class T>
  operator T() const;  // never defined: only in unevaluated operands
};

template <class C, class... A>
constexpr size_t field_count() {
  if constexpr (requires { C{A{}..., AnyValue{}}; })
    return field_count<C, A..., AnyValue>();
  else
    return sizeof...(A);
}

template <class M>
struct MemberOf;
template <class C, class T>
struct MemberOf<T C::*> {
  using Class = C;
  using Type = T;
};

void append_value(std::string& out, int64_t v);
void append_value(std::string& out, DType v);
void append_value(std::string& out, const char* v);

/// Appends `v` to a memo key: a dtype by name, a string as itself, a number, bool or enum as an integer.
template <class T>
void append_any(std::string& out, const T& v) {
  if constexpr (std::is_same_v<T, DType> || std::is_convertible_v<const T&, const char*>)
    append_value(out, v);
  else
    append_value(out, static_cast<int64_t>(v));
}

}  // namespace config_schema_detail

/// The memo key of a kernel built from plain arguments (no configuration struct): every argument of
/// its builder, in order.
template <class... A>
std::string memo_key(const A&... args) {
  std::string out;
  (config_schema_detail::append_any(out, args), ...);
  return out;
}

/// The tuning keys most chunked kernels share: rows per chunk, value columns per program, warps per
/// program and pipeline stages of the chunk loads, with their usual values.
TuningKey chunk_key(std::vector<int64_t> allowed = {16, 32, 64, 128});
TuningKey bv_key(std::vector<int64_t> allowed = {16, 32, 64, 128, 256});
TuningKey warps_key();
TuningKey stages_key();
/// Warps of their own that copy the chunk loads with TMA (Kernel::producer_warps: 0 or 4).
TuningKey producer_key();
/// A backward's switch to its token-by-token reference form (take_tokenwise reads it); `help` as the
/// family words it.
TuningKey tokenwise_key(std::string help = "--backward: 1 = the token-by-token form (the reference)");

/// One field of a configuration struct C: how it enters the memo key, and its tuning key if it has one.
template <class C>
struct ConfigField {
  void (*append)(const C&, std::string&) = nullptr;
  void (*set)(C&, int64_t) = nullptr;  // for tuned fields
  std::optional<TuningKey> tuning;
};

/// A field that specializes the kernel but is not tuned (derived from the inputs or the op's choice).
template <auto Member>
ConfigField<typename config_schema_detail::MemberOf<decltype(Member)>::Class> field() {
  using D = config_schema_detail::MemberOf<decltype(Member)>;
  ConfigField<typename D::Class> f;
  f.append = [](const typename D::Class& c, std::string& out) { config_schema_detail::append_any(out, c.*Member); };
  return f;
}

/// A field that `--config key=value` sets (an integer or a bool field: 0 or 1).
template <auto Member>
ConfigField<typename config_schema_detail::MemberOf<decltype(Member)>::Class> tuned(TuningKey key) {
  using D = config_schema_detail::MemberOf<decltype(Member)>;
  using T = typename D::Type;
  static_assert(std::is_integral_v<T>, "only integer and bool fields are tuned");
  auto f = field<Member>();
  f.set = [](typename D::Class& c, int64_t v) {
    if constexpr (std::is_same_v<T, bool>)
      c.*Member = v != 0;
    else
      c.*Member = static_cast<T>(v);
  };
  f.tuning = std::move(key);
  return f;
}

/// The description of configuration struct C: every field, in the struct's order.
template <class C>
class ConfigSchema {
 public:
  template <class... F>
  explicit ConfigSchema(F... fields) : fields_{std::move(fields)...} {
    static_assert(sizeof...(F) == config_schema_detail::field_count<C>(),
                  "a ConfigSchema lists every field of its struct (each one specializes the kernel)");
  }

  /// The memo key of `cfg`: every field's value, then `extra` (e.g. which of a family's kernels).
  template <class... Extra>
  std::string key(const C& cfg, const Extra&... extra) const {
    std::string out;
    for (const auto& f : fields_) f.append(cfg, out);
    (config_schema_detail::append_any(out, extra), ...);
    return out;
  }

  /// The tuning keys of the tuned fields, in order.
  TuningKeys tuning() const {
    TuningKeys keys;
    for (const auto& f : fields_)
      if (f.tuning) keys.push_back(*f.tuning);
    return keys;
  }

  /// Sets every tuned field whose key opts.config gives (UserError for a value not allowed) and leaves
  /// the others (the defaults). Unknown keys are check_config_keys's to refuse.
  void apply(const OpOptions& opts, C& cfg) const {
    for (const auto& f : fields_)
      if (f.tuning)
        if (auto v = f.tuning->given(opts)) f.set(cfg, *v);
  }

 private:
  std::vector<ConfigField<C>> fields_;
};

}  // namespace linac
