// libFuzzer target: the byte-level BPE tokenizer on arbitrary bytes. Contract
// (tokenizer.h): invalid UTF-8 is Error(kInvalidArgument); valid text encodes
// and decodes back to itself, with added-token matching (Encode) and without
// it (EncodeAppend over one plain range, which yields no added token at all).
// Build and run with scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_common.h"

using namespace deepinfer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& tok = fuzzing::SharedTokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> ids;
  try {
    ids = tok.Encode(text, /*add_special_tokens=*/false);
  } catch (const Error&) {
    return 0;  // not UTF-8
  }
  static const bool strips = [&] {
    for (const AddedToken& t : tok.added_tokens())
      if (t.lstrip || t.rstrip) return true;
    return false;
  }();
  if (!strips && tok.Decode(ids) != text) __builtin_trap();  // (a stripping token swallows whitespace)
  std::vector<int32_t> plain;
  const std::pair<size_t, size_t> all{0, size};
  tok.EncodeAppend(text, plain, std::span<const std::pair<size_t, size_t>>(&all, 1));
  for (int32_t id : plain)
    if (tok.IsAdded(id)) __builtin_trap();
  if (tok.Decode(plain) != text) __builtin_trap();
  return 0;
}
