#include "compiler/ir/parser.h"

#include <fmt/format.h>

#include <charconv>
#include <climits>
#include <optional>
#include <unordered_map>
#include <utility>

#include "compiler/ir/verifier.h"

namespace linac::ir {
namespace {

// Deeper nesting is certainly not a real kernel; the bound keeps the recursive descent (and the
// recursive printer and verifier after it) far from the stack limit on hostile input.
constexpr int kMaxNesting = 100;

[[noreturn]] void fail_at(const std::string& file, unsigned line, unsigned col, const std::string& msg) {
  throw UserError(SourceLoc{file, line, col}, msg);
}

bool is_ident_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_ident_char(char c) {
  return is_ident_start(c) || is_digit(c);
}

// The value of a hex digit, or -1.
int hex_digit(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A byte for an error message: quoted when printable, in hex otherwise.
std::string char_text(char ch) {
  auto c = static_cast<unsigned char>(ch);
  if (c >= 0x20 && c < 0x7f) return fmt::format("'{}'", ch);
  return fmt::format("byte 0x{:02x}", c);
}

enum class Tok : uint8_t { Eof, Ident, Value, Symbol, Number, String, Type, Punct };

struct Token {
  Tok kind = Tok::Eof;
  // Ident/Number/Type: the spelling. Value/Symbol: the name without '%'/'@'. String: the unescaped
  // bytes. Punct: the character.
  std::string text;
  unsigned line = 1, col = 1;
};

std::string describe(const Token& t) {
  switch (t.kind) {
    case Tok::Eof:
      return "end of input";
    case Tok::Ident:
      return fmt::format("'{}'", t.text);
    case Tok::Value:
      return fmt::format("'%{}'", t.text);
    case Tok::Symbol:
      return "a '@' name";
    case Tok::Number:
      return fmt::format("number {}", t.text);
    case Tok::String:
      return "a string";
    case Tok::Type:
      return fmt::format("type {}", t.text);
    case Tok::Punct:
      return fmt::format("'{}'", t.text);
  }
  return "a token";
}

/// Splits the text into tokens on demand, tracking 1-based line and column (in bytes).
class Lexer {
 public:
  Lexer(std::string_view text, const std::string& file) : text_(text), file_(file) {}

  Token next() {
    skip_space_and_comments();
    Token t;
    t.line = line_;
    t.col = col_;
    if (at_end()) return t;
    char c = peek();
    if (is_ident_start(c)) {
      t.kind = Tok::Ident;
      t.text = take_while(is_ident_char);
      if ((t.text == "tile" || t.text == "tensor") && !at_end() && peek() == '<') {
        t.kind = Tok::Type;
        t.text += type_body();
      }
    } else if (is_digit(c)) {
      t.kind = Tok::Number;
      t.text = number();
    } else if (c == '%' || c == '@') {
      advance();
      t.kind = c == '%' ? Tok::Value : Tok::Symbol;
      if (c == '@' && !at_end() && peek() == '"') {
        t.text = string_literal(t.line, t.col);
      } else {
        t.text = take_while(is_ident_char);
        if (t.text.empty()) fail_at(file_, t.line, t.col, fmt::format("expected a name after '{}'", c));
      }
    } else if (c == '"') {
      t.kind = Tok::String;
      t.text = string_literal(t.line, t.col);
    } else if (std::string_view("(){}[],:=-").find(c) != std::string_view::npos) {
      t.kind = Tok::Punct;
      t.text = std::string(1, c);
      advance();
    } else {
      fail_at(file_, line_, col_, fmt::format("unexpected character {}", char_text(c)));
    }
    return t;
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }
  void advance() {
    if (text_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }
  template <class Pred>
  std::string take_while(Pred p) {
    size_t start = pos_;
    while (!at_end() && p(peek())) advance();
    return std::string(text_.substr(start, pos_ - start));
  }

  void skip_space_and_comments() {
    while (!at_end()) {
      char c = peek();
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        advance();
      } else if (c == '/' && peek(1) == '/') {
        while (!at_end() && peek() != '\n') advance();
      } else {
        break;
      }
    }
  }

  // digits ('.' digits)? ([eE] [+-]? digits)?  -- what fmt prints for doubles, besides inf/nan.
  std::string number() {
    unsigned line = line_, col = col_;
    size_t start = pos_;
    take_while(is_digit);
    if (peek() == '.' && is_digit(peek(1))) {
      advance();
      take_while(is_digit);
    }
    if ((peek() == 'e' || peek() == 'E') &&
        (is_digit(peek(1)) || ((peek(1) == '+' || peek(1) == '-') && is_digit(peek(2))))) {
      advance();
      if (!is_digit(peek())) advance();
      take_while(is_digit);
    }
    if (!at_end() && (is_ident_char(peek()) || peek() == '.'))
      fail_at(file_, line, col, fmt::format("malformed number '{}'", text_.substr(start, pos_ - start + 1)));
    return std::string(text_.substr(start, pos_ - start));
  }

  // '<' [A-Za-z0-9_?]* '>' after "tile" or "tensor"; the parser splits the inside.
  std::string type_body() {
    advance();  // '<'
    std::string body = "<" + take_while([](char c) { return is_ident_char(c) || c == '?'; });
    if (at_end() || peek() != '>') {
      if (at_end() || peek() == '\n') fail_at(file_, line_, col_, "unterminated type: expected '>'");
      fail_at(file_, line_, col_, fmt::format("unexpected character {} in a type", char_text(peek())));
    }
    advance();
    return body + ">";
  }

  // A double-quoted string with the escapes the printer writes: \" \\ \xNN (and \n, \t).
  std::string string_literal(unsigned line, unsigned col) {
    advance();  // opening quote
    std::string out;
    for (;;) {
      if (at_end() || peek() == '\n') fail_at(file_, line, col, "unterminated string");
      char c = peek();
      advance();
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      unsigned esc_line = line_, esc_col = col_ - 1;
      char e = peek();
      if (at_end()) fail_at(file_, line, col, "unterminated string");
      advance();
      if (e == '"' || e == '\\') {
        out += e;
      } else if (e == 'n') {
        out += '\n';
      } else if (e == 't') {
        out += '\t';
      } else if (e == 'x') {
        int value = 0;
        for (int i = 0; i < 2; ++i) {
          char h = peek();
          int digit = hex_digit(h);
          if (at_end() || digit < 0) fail_at(file_, esc_line, esc_col, "\\x must be followed by two hex digits");
          value = value * 16 + digit;
          advance();
        }
        out += static_cast<char>(value);
      } else {
        fail_at(file_, esc_line, esc_col, fmt::format("unknown escape in a string: '\\' followed by {}", char_text(e)));
      }
    }
  }

  std::string_view text_;
  const std::string& file_;
  size_t pos_ = 0;
  unsigned line_ = 1, col_ = 1;
};

/// The dtype spelled exactly as the IR prints it (the CLI aliases like "fp32" are not IR).
std::optional<DType> ir_dtype(std::string_view s) {
  std::optional<DType> d = parse_dtype(s);
  if (d && dtype_name(*d) != s) return std::nullopt;
  return d;
}

/// An attribute as written, before it is matched to its op's Attrs field.
struct RawAttr {
  Token key;
  enum class Kind : uint8_t { Int, List, Word } kind = Kind::Int;
  int64_t i = 0;
  std::vector<int64_t> list;
  std::string word;
};

/// The attributes an op may carry besides those it requires (printed only where set).
std::vector<std::string_view> optional_attr_keys(OpCode c) {
  if (c == OpCode::Load) return {"prefetch"};
  return {};
}

/// The attributes each op requires (and, with optional_attr_keys, the only ones it accepts), in
/// printing order.
std::vector<std::string_view> attr_keys(OpCode c) {
  switch (c) {
    case OpCode::ProgramId:
    case OpCode::NumPrograms:
    case OpCode::Dim:
    case OpCode::ExpandDims:
    case OpCode::Take:
    case OpCode::Concat:
      return {"axis"};
    case OpCode::Slice:
    case OpCode::Place:
      return {"offsets"};
    case OpCode::Cmp:
      return {"pred"};
    case OpCode::Cast:
      return {"dtype"};
    case OpCode::Splat:
    case OpCode::Broadcast:
    case OpCode::Reshape:
      return {"shape"};
    case OpCode::Transpose:
      return {"perm"};
    case OpCode::Reduce:
      return {"axis", "kind"};
    case OpCode::Scan:
      return {"axis", "kind", "reverse"};
    case OpCode::Load:
      return {"dims", "shape"};
    case OpCode::Store:
      return {"dims"};
    default:
      return {};
  }
}

class Parser {
 public:
  Parser(std::string_view text, std::string_view filename) : file_(filename), lex_(text, file_) {}

  std::shared_ptr<Kernel> run() {
    tok_ = lex_.next();
    k_ = std::make_shared<Kernel>();
    parse_kernel();
    if (auto d = find_error(*k_)) {
      auto it = op_pos_.find(d->op);
      auto [line, col] = d->op && it != op_pos_.end() ? it->second : header_pos_;
      fail_at(file_, line, col, d->message);
    }
    return std::move(k_);
  }

 private:
  using Pos = std::pair<unsigned, unsigned>;
  struct Def {
    Value* value;
    Pos pos;
  };

  // ---- tokens ----
  [[noreturn]] void fail(const Token& at, const std::string& msg) const { fail_at(file_, at.line, at.col, msg); }
  Token take() {
    Token t = std::move(tok_);
    tok_ = lex_.next();
    return t;
  }
  bool is_punct(char c) const { return tok_.kind == Tok::Punct && tok_.text[0] == c; }
  bool is_word(std::string_view w) const { return tok_.kind == Tok::Ident && tok_.text == w; }
  bool accept_punct(char c) {
    if (!is_punct(c)) return false;
    take();
    return true;
  }
  Token expect_punct(char c, std::string_view context) {
    if (!is_punct(c)) fail(tok_, fmt::format("expected '{}' {}, got {}", c, context, describe(tok_)));
    return take();
  }
  Token expect_word(std::string_view w, std::string_view context) {
    if (!is_word(w)) fail(tok_, fmt::format("expected '{}' {}, got {}", w, context, describe(tok_)));
    return take();
  }
  Token expect_kind(Tok kind, std::string_view what, std::string_view context) {
    if (tok_.kind != kind) fail(tok_, fmt::format("expected {} {}, got {}", what, context, describe(tok_)));
    return take();
  }

  // ---- names ----
  const Def* lookup(const std::string& name) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s)
      if (auto it = s->find(name); it != s->end()) return &it->second;
    return nullptr;
  }
  void define(const Token& name, Value* v) {
    if (const Def* d = lookup(name.text))
      fail(name, fmt::format("%{} is already defined (at {}:{})", name.text, d->pos.first, d->pos.second));
    scopes_.back().emplace(name.text, Def{v, {name.line, name.col}});
  }
  Value* use() {
    Token t = expect_kind(Tok::Value, "a value", "here");
    const Def* d = lookup(t.text);
    if (!d) fail(t, fmt::format("use of undefined value %{}", t.text));
    return d->value;
  }
  // value (',' value)*, possibly empty when `optional`.
  std::vector<Value*> use_list(bool optional) {
    std::vector<Value*> out;
    if (optional && tok_.kind != Tok::Value) return out;
    out.push_back(use());
    while (accept_punct(',')) out.push_back(use());
    return out;
  }

  // ---- numbers, types, attributes, locations ----
  int64_t parse_int(std::string_view what) {
    bool negative = accept_punct('-');
    Token t = expect_kind(Tok::Number, what, "here");
    std::string s = (negative ? "-" : "") + t.text;
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc::result_out_of_range) fail(t, fmt::format("integer {} is out of range", s));
    if (ec != std::errc() || end != s.data() + s.size()) fail(t, fmt::format("expected an integer, got {}", s));
    return v;
  }

  unsigned parse_unsigned(std::string_view what) {
    Token at = tok_;
    int64_t v = parse_int(what);
    if (v < 0 || v > UINT_MAX) fail(at, fmt::format("{} {} is out of range", what, v));
    return static_cast<unsigned>(v);
  }

  Type parse_type() {
    if (tok_.kind == Tok::Ident) {
      if (auto d = ir_dtype(tok_.text)) {
        take();
        return Type::scalar(*d);
      }
      fail(tok_, fmt::format("unknown type '{}'", tok_.text));
    }
    if (tok_.kind != Tok::Type) fail(tok_, fmt::format("expected a type, got {}", describe(tok_)));
    Token t = take();
    bool tile = t.text.starts_with("tile<");
    size_t open = t.text.find('<') + 1;
    std::string_view inner(t.text.data() + open, t.text.size() - open - 1);
    // Split "64x128xbf16" on 'x' (no dtype name contains an 'x'), keeping each part's column.
    std::vector<std::pair<std::string_view, unsigned>> parts;
    size_t start = 0;
    for (size_t i = 0; i <= inner.size(); ++i)
      if (i == inner.size() || inner[i] == 'x') {
        parts.emplace_back(inner.substr(start, i - start), t.col + static_cast<unsigned>(open + start));
        start = i + 1;
      }
    auto [dtype_text, dtype_col] = parts.back();
    std::optional<DType> d = ir_dtype(dtype_text);
    if (!d) fail_at(file_, t.line, dtype_col, fmt::format("expected an element type, got '{}'", dtype_text));
    std::vector<int64_t> shape;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto [part, col] = parts[i];
      if (!tile) {
        if (part != "?")
          fail_at(file_, t.line, col,
                  fmt::format("tensor dimensions are written '?' (their sizes are runtime values), got '{}'", part));
        shape.push_back(-1);
        continue;
      }
      int64_t v = 0;
      auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
      if (part.empty() || ec != std::errc() || end != part.data() + part.size())
        fail_at(file_, t.line, col, fmt::format("expected a dimension size, got '{}'", part));
      if (v <= 0) fail_at(file_, t.line, col, fmt::format("tile dimensions must be positive, got {}", v));
      shape.push_back(v);
    }
    if (!tile) return Type::tensor(*d, static_cast<int>(shape.size()));
    if (shape.empty())
      fail(t, fmt::format("a tile needs at least one dimension; the scalar type is written {}", dtype_text));
    return Type::tile(*d, std::move(shape));
  }

  // '(' type (',' type)* ')' or a single type.
  std::vector<Type> parse_types(bool require_parens) {
    std::vector<Type> out;
    if (!require_parens && !is_punct('(')) {
      out.push_back(parse_type());
      return out;
    }
    expect_punct('(', "to open the result types");
    if (accept_punct(')')) return out;
    out.push_back(parse_type());
    while (accept_punct(',')) out.push_back(parse_type());
    expect_punct(')', "to close the result types");
    return out;
  }

  std::vector<RawAttr> parse_attr_dict() {
    std::vector<RawAttr> out;
    expect_punct('{', "to open the attributes");
    if (accept_punct('}')) return out;
    do {
      RawAttr a;
      a.key = expect_kind(Tok::Ident, "an attribute name", "here");
      expect_punct('=', fmt::format("after attribute '{}'", a.key.text));
      if (accept_punct('[')) {
        a.kind = RawAttr::Kind::List;
        if (!is_punct(']')) {
          a.list.push_back(parse_int("an integer"));
          while (accept_punct(',')) a.list.push_back(parse_int("an integer"));
        }
        expect_punct(']', "to close the list");
      } else if (tok_.kind == Tok::Ident) {
        a.kind = RawAttr::Kind::Word;
        a.word = take().text;
      } else {
        a.i = parse_int("an attribute value");
      }
      out.push_back(std::move(a));
    } while (accept_punct(','));
    expect_punct('}', "to close the attributes");
    return out;
  }

  // Matches written attributes to the op's Attrs fields: every required key, nothing else.
  Attrs parse_op_attrs(const Token& op_name, OpCode code) {
    std::vector<std::string_view> keys = attr_keys(code);
    const size_t required = keys.size();
    for (std::string_view k : optional_attr_keys(code)) keys.push_back(k);
    std::vector<RawAttr> raw;
    if (is_punct('{')) raw = parse_attr_dict();
    Attrs attrs;
    std::vector<bool> seen(keys.size(), false);
    for (const RawAttr& a : raw) {
      size_t i = 0;
      while (i < keys.size() && keys[i] != a.key.text) ++i;
      if (i == keys.size())
        fail(a.key, keys.empty() ? fmt::format("{} takes no attributes, got '{}'", op_name.text, a.key.text)
                                 : fmt::format("{} has no attribute '{}' (it takes {})", op_name.text, a.key.text,
                                               fmt::join(keys, ", ")));
      if (seen[i]) fail(a.key, fmt::format("attribute '{}' is given twice", a.key.text));
      seen[i] = true;
      set_attr(a, attrs);
    }
    for (size_t i = 0; i < required; ++i)
      if (!seen[i]) fail(op_name, fmt::format("{} needs the attribute '{}'", op_name.text, keys[i]));
    return attrs;
  }

  void set_attr(const RawAttr& a, Attrs& attrs) const {
    std::string_view key = a.key.text;
    auto need = [&](RawAttr::Kind kind, std::string_view what) {
      if (a.kind != kind) fail(a.key, fmt::format("attribute '{}' must be {}", key, what));
    };
    if (key == "axis") {
      need(RawAttr::Kind::Int, "an integer");
      attrs.axis = a.i;
    } else if (key == "shape" || key == "dims" || key == "perm" || key == "offsets") {
      need(RawAttr::Kind::List, "a list of integers like [64, 32]");
      (key == "shape" ? attrs.shape : key == "dims" ? attrs.dims : key == "perm" ? attrs.perm : attrs.offsets) = a.list;
    } else if (key == "pred") {
      need(RawAttr::Kind::Word, "one of lt, le, gt, ge, eq, ne");
      for (int p = 0; p <= static_cast<int>(CmpPred::ne); ++p)
        if (cmp_pred_name(static_cast<CmpPred>(p)) == a.word) return void(attrs.pred = static_cast<CmpPred>(p));
      fail(a.key, fmt::format("unknown predicate '{}' (expected lt, le, gt, ge, eq or ne)", a.word));
    } else if (key == "kind") {
      need(RawAttr::Kind::Word, "one of sum, max, min");
      for (int r = 0; r <= static_cast<int>(ReduceKind::min); ++r)
        if (reduce_kind_name(static_cast<ReduceKind>(r)) == a.word)
          return void(attrs.reduce = static_cast<ReduceKind>(r));
      fail(a.key, fmt::format("unknown kind '{}' (expected sum, max or min)", a.word));
    } else if (key == "dtype") {
      need(RawAttr::Kind::Word, "an element type");
      std::optional<DType> d = ir_dtype(a.word);
      if (!d) fail(a.key, fmt::format("unknown element type '{}'", a.word));
      attrs.dtype = *d;
    } else if (key == "reverse" || key == "prefetch") {
      need(RawAttr::Kind::Word, "true or false");
      if (a.word != "true" && a.word != "false") fail(a.key, fmt::format("attribute '{}' must be true or false", key));
      (key == "reverse" ? attrs.reverse : attrs.prefetch) = a.word == "true";
    }
  }

  SourceLoc parse_optional_loc() {
    if (!is_word("loc")) return {};
    take();
    expect_punct('(', "after 'loc'");
    SourceLoc loc;
    loc.file = expect_kind(Tok::String, "a quoted file name", "in loc(...)").text;
    expect_punct(':', "after the file name");
    loc.line = parse_unsigned("line");
    expect_punct(':', "after the line");
    loc.col = parse_unsigned("column");
    expect_punct(')', "to close loc(...)");
    return loc;
  }

  // ---- ops ----
  void check_result_count(const Token& op_name, size_t names, size_t types) const {
    if (names != types)
      fail(op_name, fmt::format("{} has {} result name{} but {} result type{}", op_name.text, names,
                                names == 1 ? "" : "s", types, types == 1 ? "" : "s"));
  }

  Op* create(Block& block, const Token& op_name, OpCode code, std::vector<Value*> operands,
             const std::vector<Token>& names, std::vector<Type> types, Attrs attrs, SourceLoc loc) {
    check_result_count(op_name, names.size(), types.size());
    Op* op = append_op(*k_, block, code, std::move(operands), std::move(types), std::move(attrs), std::move(loc));
    op_pos_[op] = {op_name.line, op_name.col};
    return op;
  }

  void define_results(const Op* op, const std::vector<Token>& names) {
    for (size_t i = 0; i < names.size(); ++i) define(names[i], op->results[i]);
  }

  // A new block owned by `op`, its arguments defined in a fresh scope; parses '{' op* '}'.
  void parse_region(Op* op, const std::vector<std::pair<Token, Type>>& args) {
    if (++depth_ > kMaxNesting) fail(tok_, fmt::format("regions are nested more than {} deep", kMaxNesting));
    auto owned = std::make_unique<Block>();
    Block* b = owned.get();
    b->parent = op;
    op->regions.push_back(std::move(owned));
    scopes_.emplace_back();
    for (const auto& [name, type] : args) {
      Value* v = k_->new_value(type);
      v->owner = b;
      b->args.push_back(v);
      define(name, v);
    }
    parse_block_body(*b);
    scopes_.pop_back();
    --depth_;
  }

  void parse_block_body(Block& b) {
    Token open = expect_punct('{', "to open a region");
    while (!is_punct('}')) {
      if (tok_.kind == Tok::Eof)
        fail(tok_, fmt::format("unexpected end of input: the '{{' at {}:{} is not closed", open.line, open.col));
      parse_op(b);
    }
    take();
  }

  void parse_op(Block& block) {
    std::vector<Token> names;
    if (tok_.kind == Tok::Value) {
      names.push_back(take());
      while (accept_punct(',')) names.push_back(expect_kind(Tok::Value, "a result name", "after ','"));
      expect_punct('=', "after the result names");
    }
    Token name = expect_kind(Tok::Ident, "an op name", names.empty() ? "here" : "after '='");
    OpCode code;
    if (!parse_opcode(name.text, &code)) fail(name, fmt::format("unknown op '{}'", name.text));
    switch (code) {
      case OpCode::Constant:
        return parse_constant(block, name, names);
      case OpCode::Load:
      case OpCode::Store:
        return parse_memory(block, name, code, names);
      case OpCode::For:
        return parse_for(block, name, names);
      case OpCode::If:
        return parse_if(block, name, names);
      default:
        return parse_generic(block, name, code, names);
    }
  }

  void parse_generic(Block& block, const Token& name, OpCode code, const std::vector<Token>& names) {
    std::vector<Value*> operands = use_list(true);
    Attrs attrs = parse_op_attrs(name, code);
    std::vector<Type> types;
    if (accept_punct(':')) types = parse_types(false);
    SourceLoc loc = parse_optional_loc();
    Op* op = create(block, name, code, std::move(operands), names, std::move(types), std::move(attrs), std::move(loc));
    define_results(op, names);
  }

  // constant VALUE ':' type, where VALUE is read according to the type: integers for i1/i32/i64,
  // doubles (with inf and nan) for floats.
  void parse_constant(Block& block, const Token& name, const std::vector<Token>& names) {
    bool negative = accept_punct('-');
    Token v = tok_;
    if (v.kind != Tok::Number && !(v.kind == Tok::Ident && (v.text == "inf" || v.text == "nan")))
      fail(v, fmt::format("expected a constant value, got {}", describe(v)));
    take();
    expect_punct(':', "before the constant's type");
    Token type_tok = tok_;
    Type t = parse_type();
    std::string s = (negative ? "-" : "") + v.text;
    Attrs attrs;
    const char* end = s.data() + s.size();
    if (is_float(t.dtype)) {
      auto [ptr, ec] = std::from_chars(s.data(), end, attrs.fvalue);
      if (ec == std::errc::result_out_of_range) fail(v, fmt::format("float constant {} is out of range", s));
      if (ec != std::errc() || ptr != end) fail(v, fmt::format("malformed float constant {}", s));
    } else {
      auto [ptr, ec] = std::from_chars(s.data(), end, attrs.ivalue);
      if (ec == std::errc::result_out_of_range) fail(v, fmt::format("integer constant {} is out of range", s));
      if (ec != std::errc() || ptr != end)
        fail(v, fmt::format("expected an integer constant for {}, got {}", t.str(), s));
      attrs.fvalue = static_cast<double>(attrs.ivalue);
    }
    SourceLoc loc = parse_optional_loc();
    Op* op = create(block, name, OpCode::Constant, {}, names, {t}, attrs, std::move(loc));
    define_results(op, names);
  }

  // load %t[offsets] limits[limits] {attrs} : type     store %t[offsets] limits[limits], %v {attrs}
  void parse_memory(Block& block, const Token& name, OpCode code, const std::vector<Token>& names) {
    std::vector<Value*> operands{use()};
    expect_punct('[', "before the offsets");
    std::vector<Value*> offsets = use_list(true);
    expect_punct(']', "after the offsets");
    Token limits_word = expect_word("limits", "after the offsets");
    expect_punct('[', "before the limits");
    std::vector<Value*> limits = use_list(true);
    expect_punct(']', "after the limits");
    if (offsets.size() != limits.size())
      fail(limits_word, fmt::format("{} has {} offsets but {} limits; both need one per tensor dimension", name.text,
                                    offsets.size(), limits.size()));
    operands.insert(operands.end(), offsets.begin(), offsets.end());
    operands.insert(operands.end(), limits.begin(), limits.end());
    if (code == OpCode::Store) {
      expect_punct(',', "before the stored value");
      operands.push_back(use());
    }
    Attrs attrs = parse_op_attrs(name, code);
    std::vector<Type> types;
    if (code == OpCode::Load) {
      expect_punct(':', "before the loaded type");
      types.push_back(parse_type());
    }
    SourceLoc loc = parse_optional_loc();
    Op* op = create(block, name, code, std::move(operands), names, std::move(types), std::move(attrs), std::move(loc));
    define_results(op, names);
  }

  // for %iv = %lo to %hi step %step iter_args(%c = %init, ...) : (types) loc {...}
  void parse_for(Block& block, const Token& name, const std::vector<Token>& names) {
    Token iv = expect_kind(Tok::Value, "the induction variable", "after 'for'");
    expect_punct('=', "after the induction variable");
    std::vector<Value*> operands{use()};
    expect_word("to", "after the lower bound");
    operands.push_back(use());
    expect_word("step", "after the upper bound");
    operands.push_back(use());
    std::vector<Token> carried;
    if (is_word("iter_args")) {
      take();
      expect_punct('(', "after 'iter_args'");
      do {
        carried.push_back(expect_kind(Tok::Value, "a loop-carried value name", "in iter_args"));
        expect_punct('=', "after the loop-carried value name");
        operands.push_back(use());
      } while (accept_punct(','));
      expect_punct(')', "to close iter_args");
    }
    std::vector<Type> types;
    Token colon = tok_;
    if (accept_punct(':')) types = parse_types(true);
    if (types.size() != carried.size())
      fail(colon, fmt::format("for has {} iter_args but {} result types; each loop-carried value needs one",
                              carried.size(), types.size()));
    SourceLoc loc = parse_optional_loc();
    Op* op = create(block, name, OpCode::For, std::move(operands), names, types, {}, std::move(loc));
    std::vector<std::pair<Token, Type>> args{{iv, Type::scalar(DType::i32)}};
    for (size_t i = 0; i < carried.size(); ++i) args.emplace_back(carried[i], types[i]);
    parse_region(op, args);
    define_results(op, names);
  }

  // if %cond : (types) loc {...} else {...}
  void parse_if(Block& block, const Token& name, const std::vector<Token>& names) {
    std::vector<Value*> operands{use()};
    std::vector<Type> types;
    if (accept_punct(':')) types = parse_types(true);
    SourceLoc loc = parse_optional_loc();
    Op* op = create(block, name, OpCode::If, std::move(operands), names, std::move(types), {}, std::move(loc));
    parse_region(op, {});
    expect_word("else", "after the then branch (both branches are required)");
    parse_region(op, {});
    define_results(op, names);
  }

  // kernel @name(%p: type, ...) attributes {...} loc {...}
  void parse_kernel() {
    expect_word("kernel", "at the start of the input");
    Token sym = expect_kind(Tok::Symbol, "the kernel name '@name'", "after 'kernel'");
    header_pos_ = {sym.line, sym.col};
    k_->name = sym.text;
    scopes_.emplace_back();
    expect_punct('(', "to open the parameter list");
    if (!is_punct(')')) {
      do {
        Token p = expect_kind(Tok::Value, "a parameter '%name'", "here");
        expect_punct(':', "after the parameter name");
        Type t = parse_type();
        define(p, k_->add_param(p.text, t));
      } while (accept_punct(','));
    }
    expect_punct(')', "to close the parameter list");
    if (is_word("attributes")) {
      take();
      for (const RawAttr& a : parse_attr_dict()) {
        if (a.key.text != "num_warps" && a.key.text != "num_stages" && a.key.text != "min_ctas_per_sm" &&
            a.key.text != "tensor_core_f32" && a.key.text != "producer_warps")
          fail(a.key, fmt::format("unknown kernel attribute '{}' (expected num_warps, num_stages, min_ctas_per_sm, "
                                  "tensor_core_f32 or producer_warps)",
                                  a.key.text));
        if (a.kind != RawAttr::Kind::Int || a.i < INT_MIN || a.i > INT_MAX)
          fail(a.key, fmt::format("kernel attribute '{}' must be an integer", a.key.text));
        if (a.key.text == "tensor_core_f32") {
          if (a.i != 0 && a.i != 1) fail(a.key, "kernel attribute 'tensor_core_f32' must be 0 or 1");
          k_->tensor_core_f32 = a.i == 1;
          continue;
        }
        (a.key.text == "num_warps"        ? k_->num_warps
         : a.key.text == "num_stages"     ? k_->num_stages
         : a.key.text == "producer_warps" ? k_->producer_warps
                                          : k_->min_ctas_per_sm) = static_cast<int>(a.i);
      }
    }
    k_->loc = parse_optional_loc();
    parse_block_body(k_->body);
    if (tok_.kind != Tok::Eof)
      fail(tok_, fmt::format("expected end of input after the kernel, got {}", describe(tok_)));
  }

  std::string file_;
  Lexer lex_;
  Token tok_;
  std::shared_ptr<Kernel> k_;
  std::vector<std::unordered_map<std::string, Def>> scopes_;
  std::unordered_map<const Op*, Pos> op_pos_;
  Pos header_pos_{1, 1};
  int depth_ = 0;
};

}  // namespace

std::shared_ptr<Kernel> parse(std::string_view text, std::string_view filename) {
  return Parser(text, filename).run();
}

}  // namespace linac::ir
