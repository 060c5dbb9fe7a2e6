// A small blocking HTTP/1.1 client for the server tests, on Boost.Beast (the
// library the server's transport uses for parsing; the client side here is
// independent of the server's code). One request per connection.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace deepinfer::server::http_testing {

struct TestResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string get_header_value(const std::string& name) const {
    for (const auto& [k, v] : headers)
      if (boost::beast::iequals(k, name)) return v;
    return "";
  }
};

using TestHeaders = std::vector<std::pair<std::string, std::string>>;

class TestClient {
 public:
  TestClient(std::string host, int port) : host_(std::move(host)), port_(port) {}
  void set_read_timeout(int seconds, int /*usec*/) { timeout_ = std::chrono::seconds(seconds); }

  std::optional<TestResponse> Get(const std::string& path, const TestHeaders& headers = {}) {
    return Send("GET", path, headers, "", "");
  }
  std::optional<TestResponse> Post(const std::string& path, const std::string& body, const std::string& type) {
    return Send("POST", path, {}, body, type);
  }
  std::optional<TestResponse> Post(const std::string& path, const TestHeaders& headers, const std::string& body,
                                   const std::string& type) {
    return Send("POST", path, headers, body, type);
  }

  std::optional<TestResponse> Send(const std::string& method, const std::string& path, const TestHeaders& headers,
                                   const std::string& body, const std::string& type) {
    namespace beast = boost::beast;
    namespace http = beast::http;
    namespace net = boost::asio;
    try {
      net::io_context io;
      beast::tcp_stream stream(io);
      stream.expires_after(timeout_);
      stream.connect(net::ip::tcp::endpoint(net::ip::make_address(host_), static_cast<unsigned short>(port_)));
      http::request<http::string_body> req(http::string_to_verb(method), path, 11);
      req.set(http::field::host, host_);
      for (const auto& [k, v] : headers) req.set(k, v);
      if (!type.empty()) req.set(http::field::content_type, type);
      if (method != "GET" || !body.empty()) {
        req.body() = body;
        req.prepare_payload();
      }
      http::write(stream, req);
      beast::flat_buffer buf;
      http::response_parser<http::string_body> parser;
      parser.body_limit(1u << 30);
      http::read(stream, buf, parser);
      const auto& res = parser.get();
      TestResponse out;
      out.status = static_cast<int>(res.result_int());
      for (const auto& f : res) out.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
      out.body = res.body();
      beast::error_code ignored;
      stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ignored);
      return out;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

 private:
  std::string host_;
  int port_;
  std::chrono::seconds timeout_{60};
};

}  // namespace deepinfer::server::http_testing
