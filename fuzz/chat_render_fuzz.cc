// libFuzzer target: the DeepSeek V4 / V4.1 chat renderer on arbitrary message
// lists (JSON text; the first byte picks encoding, thinking, drop_thinking,
// add_generation_prompt). Contract: a prompt, or deepinfer::Error naming the
// message — never a crash or another exception; and request text never
// yields an added token: the ids of EncodeChat decode to RenderChat's text.
// Build and run with scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "tokenizer/chat_format.h"

using namespace deepinfer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  ChatOptions o;
  o.encoding = (data[0] & 1) ? ChatEncoding::kDeepseekV41 : ChatEncoding::kDeepseekV4;
  o.thinking = data[0] & 2;
  o.drop_thinking = data[0] & 4;
  o.add_generation_prompt = data[0] & 8;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  nlohmann::ordered_json messages = nlohmann::ordered_json::parse(text, nullptr, false);
  if (messages.is_discarded()) return 0;
  try {
    const std::string rendered = RenderChat(messages, o);
    const std::vector<int32_t> ids = EncodeChat(fuzzing::SharedTokenizer(), messages, o);
    if (fuzzing::SharedTokenizer().Decode(ids) != rendered) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
