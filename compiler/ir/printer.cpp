#include "compiler/ir/printer.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

namespace linac::ir {

bool is_identifier(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

namespace {

// Quotes a string so that the parser's string literal reads back exactly the same bytes.
std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out + "\"";
}

std::string int_list(const std::vector<int64_t>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}

// The attribute dictionary of an op: exactly the fields its opcode uses (see printer.h).
std::string attr_dict(const Op& op) {
  const Attrs& a = op.attrs;
  switch (op.code) {
    case OpCode::ProgramId:
    case OpCode::NumPrograms:
    case OpCode::Dim:
    case OpCode::ExpandDims:
    case OpCode::Take:
    case OpCode::Concat:
      return fmt::format(" {{axis = {}}}", a.axis);
    case OpCode::Slice:
    case OpCode::Place:
      return fmt::format(" {{offsets = {}}}", int_list(a.offsets));
    case OpCode::Cmp:
      return fmt::format(" {{pred = {}}}", cmp_pred_name(a.pred));
    case OpCode::Cast:
      return fmt::format(" {{dtype = {}}}", dtype_name(a.dtype));
    case OpCode::Splat:
    case OpCode::Broadcast:
    case OpCode::Reshape:
      return fmt::format(" {{shape = {}}}", int_list(a.shape));
    case OpCode::Transpose:
      return fmt::format(" {{perm = {}}}", int_list(a.perm));
    case OpCode::Reduce:
      return fmt::format(" {{axis = {}, kind = {}}}", a.axis, reduce_kind_name(a.reduce));
    case OpCode::Scan:
      return fmt::format(" {{axis = {}, kind = {}, reverse = {}}}", a.axis, reduce_kind_name(a.reduce),
                         a.reverse ? "true" : "false");
    case OpCode::Load:
      return fmt::format(" {{dims = {}, shape = {}{}}}", int_list(a.dims), int_list(a.shape),
                         a.prefetch ? ", prefetch = true" : "");
    case OpCode::Store:
      return fmt::format(" {{dims = {}}}", int_list(a.dims));
    default:
      return {};
  }
}

std::string constant_text(const Op& op) {
  DType t = op.results.empty() || !op.results[0] ? DType::f32 : op.results[0]->type.dtype;
  // fmt's "{}" for double is the shortest text that reads back to the same bits (and prints
  // inf, -inf, nan, -0), which is what makes float constants round-trip.
  if (is_float(t)) return fmt::format("{}", op.attrs.fvalue);
  return fmt::format("{}", op.attrs.ivalue);
}

std::string loc_suffix(const SourceLoc& loc) {
  if (!loc.known()) return {};
  return fmt::format(" loc({}:{}:{})", quote(loc.file), loc.line, loc.col);
}

class Printer {
 public:
  explicit Printer(const ValueAnnotator* annotate = nullptr) : annotate_(annotate) {}

  std::string run(const Kernel& k) {
    std::string name = is_identifier(k.name) ? k.name : quote(k.name);
    out_ = fmt::format("kernel @{}(", name);
    for (size_t i = 0; i < k.params.size(); ++i) {
      const Param& p = k.params[i];
      if (p.value) names_[p.value] = "%" + p.name;
      Type t = p.value ? p.value->type : Type{};
      out_ += fmt::format("{}%{}: {}", i ? ", " : "", p.name, t.str());
    }
    // min_ctas_per_sm, tensor_core_f32 and producer_warps only when set: most kernels leave them.
    out_ += fmt::format(") attributes {{num_warps = {}, num_stages = {}{}{}{}}}{} {{\n", k.num_warps, k.num_stages,
                        k.min_ctas_per_sm ? fmt::format(", min_ctas_per_sm = {}", k.min_ctas_per_sm) : "",
                        k.tensor_core_f32 ? ", tensor_core_f32 = 1" : "",
                        k.producer_warps ? fmt::format(", producer_warps = {}", k.producer_warps) : "",
                        loc_suffix(k.loc));
    print_block(k.body, 2);
    out_ += "}\n";
    return std::move(out_);
  }

 private:
  // Values are numbered on first appearance; in valid IR that is their definition.
  const std::string& ref(const Value* v) {
    static const std::string kNull = "%<null>";
    if (!v) return kNull;
    auto [it, inserted] = names_.try_emplace(v);
    if (inserted) it->second = fmt::format("%{}", next_++);
    return it->second;
  }

  // The i-th element of a list of values, or %<null> past its end (malformed IR still prints).
  const std::string& ref_at(const std::vector<Value*>& vs, size_t i) { return ref(i < vs.size() ? vs[i] : nullptr); }

  void refs(const std::vector<Value*>& vs, size_t begin, size_t end) {
    for (size_t i = begin; i < end && i < vs.size(); ++i) {
      if (i > begin) out_ += ", ";
      out_ += ref(vs[i]);
    }
  }

  void result_types(const Op& op, bool parenthesize) {
    if (op.results.empty()) return;
    out_ += " : ";
    bool parens = parenthesize || op.results.size() != 1;
    if (parens) out_ += '(';
    for (size_t i = 0; i < op.results.size(); ++i) {
      if (i) out_ += ", ";
      out_ += op.results[i] ? op.results[i]->type.str() : "<null>";
      if (annotate_ && op.results[i]) {
        std::string note = (*annotate_)(op.results[i]);
        if (!note.empty()) out_ += " " + note;
      }
    }
    if (parens) out_ += ')';
  }

  void print_block(const Block& b, int indent) {
    for (const auto& op : b.ops) print_op(*op, indent);
  }

  void print_region(const Op& op, size_t i, int indent) {
    out_ += "{\n";
    if (i < op.regions.size() && op.regions[i]) print_block(*op.regions[i], indent + 2);
    out_.append(indent, ' ');
    out_ += '}';
  }

  // Load and store split their operands as (tensor, offsets, limits[, value]); the rank is implied
  // by the operand count, so the text needs no separate rank.
  void memory_operands(const Op& op, size_t num_index) {
    size_t rank = num_index / 2;
    out_ += ' ';
    out_ += ref_at(op.operands, 0);
    out_ += '[';
    refs(op.operands, 1, 1 + rank);
    out_ += "] limits[";
    refs(op.operands, 1 + rank, 1 + num_index);
    out_ += ']';
  }

  void print_for(const Op& op, int indent) {
    const Block* body = op.regions.empty() ? nullptr : op.regions[0].get();
    const std::vector<Value*> no_args;
    const std::vector<Value*>& args = body ? body->args : no_args;
    out_ += fmt::format(" {} = ", ref_at(args, 0));
    out_ += fmt::format("{} to ", ref_at(op.operands, 0));
    out_ += fmt::format("{} step ", ref_at(op.operands, 1));
    out_ += ref_at(op.operands, 2);
    size_t inits = op.operands.size() > 3 ? op.operands.size() - 3 : 0;
    size_t carried = args.size() > 1 ? args.size() - 1 : 0;
    size_t n = std::max(inits, carried);
    if (n > 0) {
      out_ += " iter_args(";
      for (size_t i = 0; i < n; ++i) {
        if (i) out_ += ", ";
        out_ += ref_at(args, 1 + i);
        out_ += " = ";
        out_ += ref_at(op.operands, 3 + i);
      }
      out_ += ')';
    }
    result_types(op, true);
    out_ += loc_suffix(op.loc);
    out_ += ' ';
    print_region(op, 0, indent);
  }

  void print_if(const Op& op, int indent) {
    out_ += ' ';
    refs(op.operands, 0, op.operands.size());
    result_types(op, true);
    out_ += loc_suffix(op.loc);
    out_ += ' ';
    print_region(op, 0, indent);
    out_ += " else ";
    print_region(op, 1, indent);
  }

  void print_op(const Op& op, int indent) {
    out_.append(indent, ' ');
    if (!op.results.empty()) {
      refs(op.results, 0, op.results.size());
      out_ += " = ";
    }
    out_ += opcode_name(op.code);
    switch (op.code) {
      case OpCode::For:
        print_for(op, indent);
        break;
      case OpCode::If:
        print_if(op, indent);
        break;
      case OpCode::Constant:
        out_ += ' ';
        out_ += constant_text(op);
        result_types(op, false);
        out_ += loc_suffix(op.loc);
        break;
      case OpCode::Load:
        memory_operands(op, op.operands.empty() ? 0 : op.operands.size() - 1);
        out_ += attr_dict(op);
        result_types(op, false);
        out_ += loc_suffix(op.loc);
        break;
      case OpCode::Store:
        memory_operands(op, op.operands.size() < 2 ? 0 : op.operands.size() - 2);
        out_ += ", ";
        out_ += op.operands.size() < 2 ? ref(nullptr) : ref(op.operands.back());
        out_ += attr_dict(op);
        out_ += loc_suffix(op.loc);
        break;
      default:
        if (!op.operands.empty()) {
          out_ += ' ';
          refs(op.operands, 0, op.operands.size());
        }
        out_ += attr_dict(op);
        result_types(op, false);
        out_ += loc_suffix(op.loc);
        break;
    }
    out_ += '\n';
  }

  const ValueAnnotator* annotate_;
  std::string out_;
  std::unordered_map<const Value*, std::string> names_;
  int next_ = 0;

 public:
  const std::unordered_map<const Value*, std::string>& names() const { return names_; }
};

}  // namespace

std::string print(const Kernel& k) {
  return Printer().run(k);
}

std::string print(const Kernel& k, const ValueAnnotator& annotate) { return Printer(&annotate).run(k); }

std::map<const Value*, std::string> value_names(const Kernel& k) {
  Printer p;
  p.run(k);
  return {p.names().begin(), p.names().end()};
}

}  // namespace linac::ir
