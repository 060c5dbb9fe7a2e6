// deepinfer/structured/gbnf.h — llama.cpp's GBNF grammar syntax → grammar.
//
// Syntax (llama.cpp grammars/README.md): rules `name ::= alternatives`;
// alternatives separated by `|`; items: "literal" (escapes \n \r \t \\ \"
// \] \[ \xHH \uHHHH \UHHHHHHHH), [class] / [^class] with ranges, `.` (any
// character), a rule name, ( group ); postfix * + ? {m} {m,} {m,n}; `#`
// comments to the end of the line. A rule's body runs until the next
// `name ::=`; newlines are otherwise plain whitespace. Rule names are
// [A-Za-z0-9_-]+; the start rule is `root`. Characters are code points,
// matched as their UTF-8 bytes.
//
// Errors (Error kInvalidArgument, "guided_grammar: ... at line L column C"):
// syntax errors, an undefined rule, no `root`, left recursion (grammar.h).
#pragma once

#include <string>
#include <string_view>

#include "structured/grammar.h"

namespace deepinfer::structured {

// Parses `text` into `g` and sets g's root to `root`; `what` names the field.
void CompileGbnf(Grammar& g, std::string_view text, const std::string& what);

}  // namespace deepinfer::structured
