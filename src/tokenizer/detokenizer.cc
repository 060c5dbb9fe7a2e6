#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace deepinfer {

void IncrementalDetokenizer::Feed(std::string_view bytes, std::string& out) {
  pending_.append(bytes);
  size_t i = 0;
  const std::string_view p = pending_;
  while (i < p.size()) {
    if (static_cast<unsigned char>(p[i]) < 0x80) { out.push_back(p[i++]); continue; }
    const utf8::Seq q = utf8::Inspect(p, i);
    if (q.kind == utf8::SeqKind::kIncomplete) break;  // may still be completed: hold back
    if (q.kind == utf8::SeqKind::kValid) out.append(p.substr(i, q.len));
    else out.append(utf8::kReplacement);
    i += q.len;
  }
  pending_.erase(0, i);
}

std::string IncrementalDetokenizer::Push(int32_t id) {
  const std::string_view b = tok_->TokenBytes(id);  // throws before any state change
  std::string out;
  if (skip_special_ && tok_->IsSpecial(id)) return out;
  Feed(b, out);
  return out;
}

std::string IncrementalDetokenizer::Push(std::span<const int32_t> ids) {
  for (int32_t id : ids) tok_->TokenBytes(id);  // validate all first
  std::string out;
  for (int32_t id : ids) {
    if (skip_special_ && tok_->IsSpecial(id)) continue;
    Feed(tok_->TokenBytes(id), out);
  }
  return out;
}

std::string IncrementalDetokenizer::Prime(std::span<const int32_t> prompt_ids) { return Push(prompt_ids); }

std::string IncrementalDetokenizer::Flush() {
  std::string out = utf8::DecodeLossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace deepinfer
