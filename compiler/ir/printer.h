// The tile IR text format: print() writes it, parse() (parser.h) reads it back.
//
// The format is MLIR-like and line oriented: one op per line, regions in braces, every op's attributes,
// result types and source location on its own line, so FileCheck patterns can match single lines.
//
//   kernel @scale_rows(%x: tensor<?x?xf32>, %s: f32) attributes {num_warps = 4, num_stages = 2} loc("k.cpp":9:1) {
//     %0 = program_id {axis = 0} : i32 loc("k.cpp":12:3)
//     %1 = constant 0 : i32
//     %2 = dim %x {axis = 1} : i32
//     %3 = constant 1 : i32
//     %4 = add %0, %3 : i32
//     %5 = load %x[%0, %1] limits[%4, %2] {dims = [1], shape = [128]} : tile<128xf32>
//     %6 = splat %s {shape = [128]} : tile<128xf32>
//     %7 = mul %5, %6 : tile<128xf32>
//     %8, %9 = for %10 = %1 to %2 step %3 iter_args(%11 = %7, %12 = %s) : (tile<128xf32>, f32) {
//       %13 = exp %11 : tile<128xf32>
//       yield %13, %12
//     }
//     %14 = cmp %9, %s {pred = lt} : i1
//     %15 = if %14 : (f32) {
//       yield %9
//     } else {
//       yield %s
//     }
//     store %x[%0, %1] limits[%4, %2], %8 {dims = [1]}
//   }
//
// Grammar (`//` starts a comment that runs to the end of the line; whitespace is insignificant):
//   kernel  := 'kernel' '@' NAME '(' (param (',' param)*)? ')' ('attributes' attrs)? loc? '{' op* '}'
//   param   := '%' NAME ':' type
//   op      := (value (',' value)* '=')? body loc?
//   body    := 'constant' NUMBER ':' type
//            | 'load' value '[' values ']' 'limits' '[' values ']' attrs ':' type
//            | 'store' value '[' values ']' 'limits' '[' values ']' ',' value attrs
//            | 'for' value '=' value 'to' value 'step' value ('iter_args' '(' value '=' value, ... ')')?
//                (':' '(' types ')')? loc? region                      (the loc comes before the region)
//            | 'if' value (':' '(' types ')')? loc? region 'else' region
//            | OPNAME values attrs? (':' type | ':' '(' types ')')?   (every other op, yield included)
//   region  := '{' op* '}'
//   attrs   := '{' KEY '=' (INT | '[' INT, ... ']' | IDENT) (',' ...)* '}'
//   type    := i1 | i32 | i64 | f16 | bf16 | f32 | f64 | 'tile<' (INT 'x')+ DTYPE '>' | 'tensor<' ('?x')* DTYPE '>'
//   loc     := 'loc' '(' STRING ':' INT ':' INT ')'
//
// Canonical form: print(parse(print(k))) == print(k) byte for byte.
//  - Kernel parameters print as %name. Every other value is %0, %1, ... numbered in order of first
//    appearance in the text (for `%8, %9 = for %10 = ... iter_args(%11 = ...)` the results come first,
//    then the induction variable, then the carried values); Value::id and Value::name are not printed.
//    The parser accepts any %name for non-parameters, so hand-written IR may use %acc, %i, ...; names
//    are lexically scoped (a region's names end with it) and may not shadow a visible name.
//  - Each opcode prints exactly the attributes it uses, in a fixed order:
//      program_id, num_programs, dim, expand_dims, take, concat: {axis}     cmp: {pred = lt|le|gt|ge|eq|ne}
//      cast: {dtype}    splat, broadcast, reshape: {shape}    transpose: {perm} (result dim i = source dim perm[i])
//      reduce: {axis, kind = sum|max|min}    scan: {axis, kind, reverse = true|false}
//      load: {dims, shape}    store: {dims}    slice, place: {offsets} (one per axis)
//    The parser requires all of them and rejects any other.
//  - constant prints attrs.ivalue for integer dtypes (i1, i32, i64) and attrs.fvalue for float dtypes,
//    as the shortest decimal that reads back to the same double ("0.1", "1e+30", "inf", "-inf", "nan",
//    "-0"). The parser fills both fields: ivalue and fvalue = ivalue for integers, fvalue and
//    ivalue = 0 for floats.
//  - Results print their types after ':' (for/if always in parentheses). Ops without results print
//    none; an op's operand types are those of the operands' definitions.
//  - loc("file":line:col) is printed when the location is known (line != 0). File names and quoted
//    kernel names escape '"', '\' and bytes outside printable ASCII as \" \\ \xNN.
//
// The printer does not require verified IR (wrong operand counts print with %<null> for what is
// missing, values used out of scope get the next number), so it can dump IR that failed verification;
// only valid IR is guaranteed to read back.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "compiler/ir/ir.h"

namespace linac::ir {

/// The canonical text of a kernel (see the format above). Ends with a newline.
std::string print(const Kernel& k);

/// Extra text printed after a result's type (e.g. its layout, "#mma<warps=4x1>"); empty for none.
/// Annotated text is for dumps: the parser does not read annotations back.
using ValueAnnotator = std::function<std::string(const Value*)>;
std::string print(const Kernel& k, const ValueAnnotator& annotate);

/// The name each value has in print(k) ("%q", "%12"), for passes that report on values.
std::map<const Value*, std::string> value_names(const Kernel& k);

/// Whether `s` is an identifier of the text format: [A-Za-z_][A-Za-z0-9_]*. Kernel and parameter
/// names must be identifiers (the verifier checks it); anything else would not read back as a name.
bool is_identifier(std::string_view s);

}  // namespace linac::ir
