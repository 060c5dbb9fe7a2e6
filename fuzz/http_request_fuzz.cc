// libFuzzer target: whole raw HTTP requests through the server's request path
// — the transport's parser with its limits and chunked decoding
// (ParseHttpRequest, the same settings a connection uses), then for the JSON
// routes the body through ParseJsonBody and the completions / chat schemas.
// Contract: a request, or an error the server answers (HttpParseError with a
// status, ApiError, deepinfer::Error) — never a crash, another exception, a
// leak or a hang. Build and run with scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_common.h"
#include "server/http_transport.h"

using namespace deepinfer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  server::HttpRequest req;
  server::HttpParseError err;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (!server::ParseHttpRequest(bytes, 4096, 65536, &req, &err)) {
    if (err.status != 0 && err.status != 400 && err.status != 431) __builtin_trap();
    return 0;
  }
  (void)req.Header("Authorization");
  (void)req.Header("content-type");
  if (req.path != "/v1/completions" && req.path != "/v1/chat/completions") return 0;
  try {
    const nlohmann::json body = server::ParseJsonBody(req.body);
    if (req.path == "/v1/completions") {
      server::ParseCompletionRequest(body, fuzzing::SharedInfo()).ToGenerateRequests("cmpl-f");
    } else {
      server::ParseChatRequest(body, nlohmann::ordered_json::parse(req.body), fuzzing::SharedInfo())
          .ToGenerateRequests("chatcmpl-f");
    }
  } catch (const server::ApiError&) {
  } catch (const Error&) {
  }
  return 0;
}
