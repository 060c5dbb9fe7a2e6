// deepinfer/vision/image_source.h — images named by chat content blocks
// (OpenAI's {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},
// also "image_url": "<url>" and DeepSeek's {"type": "image", "data"|"url"|
// "source": ...}): their bytes, decoded and preprocessed (image.h). No network:
// only data: URLs, and local files where the caller allows them (the CLI).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "vision/image.h"

namespace deepinfer::vision {

// Standard base64 (RFC 4648, '=' padding optional, whitespace ignored).
// Throws Error(kInvalidArgument) "<what>: invalid base64 ..." on bad input.
std::string DecodeBase64(std::string_view in, const std::string& what);

// The bytes an image URL names. `field` is the JSON path for messages
// ("messages[0].content[1].image_url.url"). "data:<mime>;base64,<payload>" is
// decoded; http(s):// and every other scheme are refused naming the field
// ("only data: URLs are accepted (no network access)"); a plain path or
// file:// URL is read when allow_files, refused otherwise; only a regular
// file of at most kMaxImageFileBytes is read (else Error(kInvalidArgument)
// naming the field and the file).
inline constexpr uintmax_t kMaxImageFileBytes = uintmax_t{64} << 20;  // 64 MiB
std::string ImageUrlBytes(const std::string& url, const std::string& field, bool allow_files);

// Every image block of `messages` in rendering order (message order, blocks in
// order, tool_result contents recursively: the order of the placeholders the
// chat renderer writes), each decoded and preprocessed with `g`. Errors are
// Error(kInvalidArgument) naming the block's field and the problem.
std::vector<std::shared_ptr<const PreparedImage>> CollectImages(const nlohmann::json& messages,
                                                                const VisionGeometry& g, bool allow_files);

// Expands each image_token_id placeholder of `ids` into images[i]'s span
// length (the engine's input form is either; docs/vision.md) — the ids the
// engine will run, for counting (/tokenize, prompt_tokens).
std::vector<int32_t> ExpandPlaceholders(const std::vector<int32_t>& ids, int32_t image_token_id,
                                        const std::vector<std::shared_ptr<const PreparedImage>>& images);

}  // namespace deepinfer::vision
