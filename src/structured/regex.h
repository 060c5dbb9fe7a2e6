// deepinfer/structured/regex.h — regular expressions → grammar rules.
//
// Syntax (the JSON-Schema `pattern` subset, ECMAScript flavour as ajv checks
// it, and vLLM's guided_regex): literals; `.` (any character but \n \r U+2028
// U+2029); classes [abc] [a-z] [^...] with escapes inside; \d \D \w \W \s \S
// (ECMAScript sets: \d = [0-9], \w = [A-Za-z0-9_], \s = ECMAScript white
// space); \n \r \t \f \v \0 \xHH \uHHHH \u{H...} and escaped punctuation;
// groups (...) (?:...) (?<name>...); alternation |; quantifiers * + ? {n}
// {n,} {n,m}, optionally lazy (`*?`, same language). `^` at the very start and
// `$` at the very end are anchors.
//
// Not supported (Error kInvalidArgument naming the construct and its offset):
// backreferences, lookahead/lookbehind, \b \B, possessive quantifiers,
// anchors elsewhere, POSIX classes, \p{...}, inline flags.
//
// Matching mode: kFullMatch (guided_regex: the whole output matches; anchors
// optional) or kSearch (JSON Schema `pattern`: the string CONTAINS a match —
// an unanchored side gets "any characters" added).
// `allowed` (optional) restricts every character the regex may produce, e.g.
// to the characters a JSON string may hold unescaped; characters outside it
// make their branch impossible.
#pragma once

#include <string>
#include <string_view>

#include "structured/grammar.h"

namespace deepinfer::structured {

enum class RegexMode { kFullMatch, kSearch };

// Adds the regex to `g`; returns an element matching exactly its language.
// `what` names the field in errors ("guided_regex", "pattern at /properties/id").
Element CompileRegex(Grammar& g, std::string_view pattern, RegexMode mode, const CodepointRanges* allowed,
                     const std::string& what);

}  // namespace deepinfer::structured
