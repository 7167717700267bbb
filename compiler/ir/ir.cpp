#include "compiler/ir/ir.h"

#include <array>
#include <fmt/format.h>
#include <utility>

namespace linac::ir {

int64_t Type::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Type::str() const {
  switch (kind) {
    case Kind::Scalar: return std::string(dtype_name(dtype));
    case Kind::Tile: return fmt::format("tile<{}x{}>", fmt::join(shape, "x"), dtype_name(dtype));
    case Kind::Tensor: {
      std::string s = "tensor<";
      for (size_t i = 0; i < shape.size(); ++i) s += "?x";
      return s + std::string(dtype_name(dtype)) + ">";
    }
  }
  throw InternalError("bad type kind");
}

Value* Kernel::new_value(Type t, std::string name) {
  auto v = std::make_unique<Value>();
  v->id = static_cast<int>(values_.size());
  v->type = std::move(t);
  v->name = std::move(name);
  values_.push_back(std::move(v));
  return values_.back().get();
}

Value* Kernel::add_param(std::string name, Type t) {
  Value* v = new_value(std::move(t), name);
  v->owner = &body;
  body.args.push_back(v);
  params.push_back({std::move(name), v});
  return v;
}

const Param* Kernel::find_param(std::string_view name) const {
  for (const auto& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

Op* append_op(Kernel& k, Block& block, OpCode code, std::vector<Value*> operands,
              std::vector<Type> result_types, Attrs attrs, SourceLoc loc) {
  auto op = std::make_unique<Op>();
  op->code = code;
  op->operands = std::move(operands);
  op->attrs = std::move(attrs);
  op->loc = std::move(loc);
  op->parent = &block;
  for (auto& t : result_types) {
    Value* v = k.new_value(std::move(t));
    v->def = op.get();
    op->results.push_back(v);
  }
  block.ops.push_back(std::move(op));
  return block.ops.back().get();
}

namespace {
constexpr std::array<std::pair<OpCode, std::string_view>, 46> kOpNames = {{
    {OpCode::Constant, "constant"},   {OpCode::ProgramId, "program_id"},
    {OpCode::NumPrograms, "num_programs"}, {OpCode::Dim, "dim"},
    {OpCode::Iota, "iota"},           {OpCode::Add, "add"},
    {OpCode::Sub, "sub"},             {OpCode::Mul, "mul"},
    {OpCode::Div, "div"},             {OpCode::Rem, "rem"},
    {OpCode::Max, "max"},             {OpCode::Min, "min"},
    {OpCode::Pow, "pow"},             {OpCode::Neg, "neg"},
    {OpCode::Exp, "exp"},             {OpCode::Exp2, "exp2"},
    {OpCode::Log, "log"},             {OpCode::Log2, "log2"},
    {OpCode::Sigmoid, "sigmoid"},     {OpCode::Sqrt, "sqrt"},
    {OpCode::Rsqrt, "rsqrt"},         {OpCode::Abs, "abs"},
    {OpCode::Cmp, "cmp"},             {OpCode::And, "and"},
    {OpCode::Or, "or"},               {OpCode::Not, "not"},
    {OpCode::Select, "select"},       {OpCode::Cast, "cast"},
    {OpCode::Splat, "splat"},         {OpCode::Broadcast, "broadcast"},
    {OpCode::ExpandDims, "expand_dims"}, {OpCode::Reshape, "reshape"},
    {OpCode::Transpose, "transpose"}, {OpCode::Reduce, "reduce"},
    {OpCode::Scan, "scan"},           {OpCode::Take, "take"},
    {OpCode::Slice, "slice"},         {OpCode::Concat, "concat"},
    {OpCode::Place, "place"},
    {OpCode::Dot, "dot"},
    {OpCode::Load, "load"},           {OpCode::Store, "store"},
    {OpCode::Signal, "signal"},       {OpCode::Wait, "wait"},
    {OpCode::For, "for"},             {OpCode::If, "if"},
}};
}  // namespace

std::string_view opcode_name(OpCode c) {
  if (c == OpCode::Yield) return "yield";
  for (auto& [code, name] : kOpNames)
    if (code == c) return name;
  throw InternalError("opcode without a name");
}

bool parse_opcode(std::string_view s, OpCode* out) {
  if (s == "yield") {
    *out = OpCode::Yield;
    return true;
  }
  for (auto& [code, name] : kOpNames)
    if (name == s) {
      *out = code;
      return true;
    }
  return false;
}

std::string_view cmp_pred_name(CmpPred p) {
  static constexpr std::string_view names[] = {"lt", "le", "gt", "ge", "eq", "ne"};
  return names[static_cast<int>(p)];
}

std::string dsl_spelling(OpCode c) {
  switch (c) {
    case OpCode::Constant: return "full";
    case OpCode::Add: return "`+`";
    case OpCode::Sub: return "`-`";
    case OpCode::Mul: return "`*`";
    case OpCode::Div: return "`/`";
    case OpCode::Rem: return "`%`";
    case OpCode::Neg: return "unary `-`";
    case OpCode::Max: return "maximum";
    case OpCode::Min: return "minimum";
    case OpCode::And: return "`&`";
    case OpCode::Or: return "`|`";
    case OpCode::Not: return "`!`";
    case OpCode::Cmp: return "comparison";
    case OpCode::Select: return "where";
    case OpCode::Splat:
    case OpCode::Broadcast: return "broadcast_to";
    case OpCode::Reduce: return "sum/max/min";
    case OpCode::Scan: return "cumsum";
    case OpCode::For: return "for_range";
    case OpCode::If: return "if_then";
    default: return std::string(opcode_name(c));
  }
}

std::string dsl_spelling(const Op& op) {
  switch (op.code) {
    case OpCode::Cmp: {
      static constexpr std::string_view ops[] = {"`<`", "`<=`", "`>`", "`>=`", "`==`", "`!=`"};
      return op.attrs.pred <= CmpPred::ne ? std::string(ops[static_cast<int>(op.attrs.pred)]) : "comparison";
    }
    case OpCode::Reduce:
      return op.attrs.reduce <= ReduceKind::min ? std::string(reduce_kind_name(op.attrs.reduce)) : "sum/max/min";
    case OpCode::Yield: {
      const Op* owner = op.parent ? op.parent->parent : nullptr;
      return owner && owner->code == OpCode::If ? "if_then" : "for_range";
    }
    default: return dsl_spelling(op.code);
  }
}

std::string_view reduce_kind_name(ReduceKind r) {
  static constexpr std::string_view names[] = {"sum", "max", "min"};
  return names[static_cast<int>(r)];
}

bool is_unary_math(OpCode c) {
  switch (c) {
    case OpCode::Neg: case OpCode::Exp: case OpCode::Exp2: case OpCode::Log: case OpCode::Log2:
    case OpCode::Sigmoid: case OpCode::Sqrt: case OpCode::Rsqrt: case OpCode::Abs: case OpCode::Not:
      return true;
    default: return false;
  }
}

bool is_binary_arith(OpCode c) {
  switch (c) {
    case OpCode::Add: case OpCode::Sub: case OpCode::Mul: case OpCode::Div: case OpCode::Rem:
    case OpCode::Max: case OpCode::Min: case OpCode::Pow: case OpCode::And: case OpCode::Or:
      return true;
    default: return false;
  }
}

bool defined_in(const Value* v, const Block& b) {
  for (const Block* blk = v->def ? v->def->parent : v->owner; blk; blk = blk->parent ? blk->parent->parent : nullptr)
    if (blk == &b) return true;
  return false;
}

bool is_elementwise(OpCode c) {
  return is_unary_math(c) || is_binary_arith(c) || c == OpCode::Cmp || c == OpCode::Select ||
         c == OpCode::Cast;
}

std::set<std::string> stored_params(const Kernel& k) {
  std::set<const Value*> stored;
  walk(const_cast<Block&>(k.body), [&](Op& op) {
    if ((op.code == OpCode::Store || op.code == OpCode::Signal) && !op.operands.empty()) stored.insert(op.operands[0]);
  });
  std::set<std::string> names;
  for (const auto& p : k.params)
    if (stored.count(p.value)) names.insert(p.name);
  return names;
}

}  // namespace linac::ir
