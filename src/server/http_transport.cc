#include "server/http_transport.h"

#include <sys/resource.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/error.h"

namespace deepinfer::server {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

const char* Reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

// Status line and headers (no body). `length` < 0: streaming (chunked when
// `chunked`, else close-delimited).
std::string Head(int status, std::string_view content_type, const HttpHeaders& extra, int64_t length, bool chunked,
                 bool keep_alive) {
  std::string h = fmt::format("HTTP/1.1 {} {}\r\n", status, Reason(status));
  if (!content_type.empty()) h += fmt::format("Content-Type: {}\r\n", content_type);
  if (length >= 0) h += fmt::format("Content-Length: {}\r\n", length);
  else if (chunked) h += "Transfer-Encoding: chunked\r\n";
  for (const HttpHeader& x : extra) {
    // Header injection guard: a CR or LF in a name or value would split the response.
    if (x.name.find_first_of("\r\n:") != std::string::npos || x.value.find_first_of("\r\n") != std::string::npos)
      continue;
    h += x.name + ": " + x.value + "\r\n";
  }
  if (!keep_alive) h += "Connection: close\r\n";
  h += "\r\n";
  return h;
}

using RequestParser = http::request_parser<http::string_body>;

void ConfigureParser(RequestParser& p, size_t max_header_bytes, size_t max_request_bytes) {
  p.header_limit(static_cast<std::uint32_t>(std::min<size_t>(max_header_bytes, UINT32_MAX)));
  p.body_limit(static_cast<std::uint64_t>(max_request_bytes));
}

HttpRequest ToHttpRequest(http::request<http::string_body>&& msg) {
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  req.path = req.target.substr(0, req.target.find('?'));
  req.version = static_cast<int>(msg.version());
  for (const auto& f : msg) req.headers.push_back(HttpHeader{std::string(f.name_string()), std::string(f.value())});
  req.body = std::move(msg.body());
  return req;
}

// The status, code and message a parse error is answered with (status 0: the
// client went away or the input is incomplete; nothing to answer).
HttpParseError ClassifyParseError(beast::error_code ec, size_t max_header_bytes, size_t max_request_bytes) {
  HttpParseError e;
  if (ec == http::error::header_limit) {
    e = {431, "header_too_large",
         fmt::format("the request header is larger than this server's limit of {} bytes", max_header_bytes)};
  } else if (ec == http::error::body_limit) {
    e = {400, "request_too_large",
         fmt::format("the request body is larger than this server's limit of {} bytes (--max-request-bytes)",
                     max_request_bytes)};
  } else if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == http::error::need_more ||
             ec == net::error::eof || ec == net::error::connection_reset || ec == net::error::operation_aborted ||
             ec == beast::error::timeout) {
    e = {0, "", ""};
  } else {
    e = {400, "bad_request",
         fmt::format("the HTTP request could not be read ({}): check the request line, the headers and the "
                     "Content-Length or chunked framing of the body",
                     ec.message())};
  }
  return e;
}

}  // namespace

bool ParseHttpRequest(std::string_view bytes, size_t max_header_bytes, size_t max_request_bytes, HttpRequest* out,
                      HttpParseError* error) {
  RequestParser p;
  ConfigureParser(p, max_header_bytes, max_request_bytes);
  p.eager(true);
  beast::error_code ec;
  size_t used = 0;
  while (!ec && !p.is_done() && used < bytes.size()) {
    const size_t n = p.put(net::buffer(bytes.data() + used, bytes.size() - used), ec);
    if (n == 0 && !ec) break;
    used += n;
  }
  if (ec == http::error::need_more) ec = {};
  if (!ec && !p.is_done()) {
    p.put_eof(ec);  // the bytes end here
    if (!ec && !p.is_done()) ec = http::error::partial_message;
  }
  if (ec) {
    *error = ClassifyParseError(ec, max_header_bytes, max_request_bytes);
    return false;
  }
  *out = ToHttpRequest(p.release());
  return true;
}

std::string HttpRequest::Header(std::string_view name) const {
  for (const HttpHeader& h : headers)
    if (IEquals(h.name, name)) return h.value;
  return "";
}

class Connection;

struct HttpTransport::Impl : std::enable_shared_from_this<HttpTransport::Impl> {
  HttpTransportOptions opts;
  Handler handler;
  ErrorBodyFn error_body;
  net::io_context io;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<net::thread_pool> pool;
  tcp::acceptor acceptor{io};
  std::vector<std::thread> threads;
  std::atomic<bool> stopping{false};
  bool started = false, stopped = false;
  int max_connections = 0;
  std::mutex stop_mu;

  std::mutex conns_mu;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> conns;

  std::atomic<int64_t> open{0}, accepted{0}, rejected{0}, idle_to{0}, header_to{0}, body_to{0}, write_to{0},
      disconnects{0}, requests{0};

  void DoAccept();
  void Reject(tcp::socket s);
  void Forget(Connection* c) {
    std::lock_guard<std::mutex> lock(conns_mu);
    conns.erase(c);
  }
  std::string ErrorResponse(int status, const std::string& message, const std::string& code) {
    auto [body, type] = error_body(status, message, code);
    return Head(status, type, {}, static_cast<int64_t>(body.size()), false, false) + body;
  }
};

namespace {

class ExchangeImpl;

}  // namespace

// One accepted socket. Every member is touched only on its strand.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket s, std::shared_ptr<HttpTransport::Impl> t) : stream_(std::move(s)), t_(std::move(t)) {}
  ~Connection() = default;

  void Start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->NextRequest(); });
  }
  // From any thread.
  void PostClose() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->Close(false); });
  }
  void PostCloseIfIdle() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->phase_ != Phase::kHandling && self->phase_ != Phase::kLinger) self->Close(false);
    });
  }
  // `close_after`: the response said "Connection: close" (or is close-delimited).
  void PostWrite(std::string bytes, bool ends_response, bool close_after = false) {
    net::post(stream_.get_executor(),
              [self = shared_from_this(), b = std::move(bytes), ends_response, close_after]() mutable {
                if (close_after) self->keep_alive_ = false;
                self->Enqueue(std::move(b), ends_response);
              });
  }
  bool stopping() const { return t_->stopping.load(); }

 private:
  enum class Phase { kIdle, kHeader, kBody, kHandling, kLinger, kClosed };

  void NextRequest();
  void ReadHeader();
  void OnHeader(beast::error_code ec);
  void ReadBody();
  void OnBody(beast::error_code ec);
  void StartMonitor();
  void OnMonitor(beast::error_code ec, size_t n);
  void Enqueue(std::string bytes, bool ends_response);
  void DoWrite();
  void OnWrite(beast::error_code ec);
  void EndExchange();
  // Answers a transport-level error, then closes.
  void FailRequest(int status, const std::string& message, const std::string& code);
  // After the last response of a "Connection: close" exchange: stop sending,
  // read (and drop) what the client still sends for a moment, then close, so
  // the client reads the response instead of a reset.
  void Linger();
  void LingerRead();
  void Close(bool client_gone);

  struct Pending {
    std::string bytes;
    bool ends_response;
  };

  beast::tcp_stream stream_;
  std::shared_ptr<HttpTransport::Impl> t_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Phase phase_ = Phase::kIdle;
  std::weak_ptr<ExchangeImpl> exchange_;  // the handler owns it; a 500 goes out if it is dropped unanswered
  bool in_exchange_ = false;
  bool keep_alive_ = true;
  bool monitor_pending_ = false;
  bool restart_after_monitor_ = false;
  bool writing_ = false;
  std::deque<Pending> wq_;

  friend class ExchangeImpl;
};

namespace {

class ExchangeImpl : public HttpExchange {
 public:
  ExchangeImpl(HttpRequest req, std::shared_ptr<Connection> conn, bool keep_alive)
      : req_(std::move(req)), conn_(std::move(conn)), keep_alive_(keep_alive),
        head_(req_.method == "HEAD"), http10_(req_.version == 10) {}
  ~ExchangeImpl() override {
    std::shared_ptr<Connection> c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_ && conn_) c = conn_;
      conn_.reset();
    }
    if (c) {
      const std::string body = "{\"error\": {\"message\": \"internal error: the request was not answered\", "
                               "\"type\": \"server_error\", \"param\": null, \"code\": null}}";
      c->PostWrite(Head(500, "application/json", {}, static_cast<int64_t>(body.size()), false, false) + body, true,
                   true);
    }
  }

  const HttpRequest& request() const override { return req_; }

  void Respond(int status, std::string_view content_type, std::string body, HttpHeaders extra) override {
    std::shared_ptr<Connection> c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (started_ || !conn_) return;
      started_ = true;
      c = conn_;
    }
    const bool ka = keep_alive_ && !c->stopping();
    std::string bytes = Head(status, content_type, extra, static_cast<int64_t>(body.size()), false, ka);
    if (!head_) bytes += body;
    c->PostWrite(std::move(bytes), true, !ka);
  }

  void StartStream(int status, std::string_view content_type, HttpHeaders extra) override {
    std::shared_ptr<Connection> c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (started_ || !conn_) return;
      started_ = streaming_ = true;
      c = conn_;
    }
    // HTTP/1.0 has no chunked encoding: the body ends when the connection closes.
    const bool ka = keep_alive_ && !http10_ && !c->stopping();
    c->PostWrite(Head(status, content_type, extra, -1, !http10_, ka), false, !ka);
    if (head_) c->PostWrite("", true);
  }

  void Write(std::string data) override {
    if (data.empty() || head_) return;
    std::shared_ptr<Connection> c = Live();
    if (!c) return;
    if (http10_) c->PostWrite(std::move(data), false);
    else c->PostWrite(fmt::format("{:x}\r\n", data.size()) + data + "\r\n", false);
  }

  void End() override {
    std::shared_ptr<Connection> c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!streaming_ || ended_ || !conn_) return;
      ended_ = true;
      c = conn_;
    }
    if (head_) return;
    c->PostWrite(http10_ ? std::string() : std::string("0\r\n\r\n"), true);
  }

  void OnClose(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_) {
        on_close_.push_back(std::move(fn));
        return;
      }
    }
    fn();
  }

  bool closed() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

  // From the connection's strand: the response is complete (release the connection).
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    conn_.reset();
    on_close_.clear();
  }
  // From the connection's strand: the client is gone before the response completed.
  void MarkClosed() {
    std::vector<std::function<void()>> fns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      conn_.reset();
      fns.swap(on_close_);
    }
    for (auto& f : fns) f();
  }

 private:
  std::shared_ptr<Connection> Live() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!streaming_ || ended_) return nullptr;
    return conn_;
  }

  HttpRequest req_;
  mutable std::mutex mu_;
  std::shared_ptr<Connection> conn_;  // reset when the response completes or the client is gone
  std::vector<std::function<void()>> on_close_;
  bool keep_alive_;
  bool head_, http10_;
  bool started_ = false, streaming_ = false, ended_ = false, closed_ = false;
};

}  // namespace

void Connection::NextRequest() {
  if (phase_ == Phase::kClosed) return;
  if (stopping()) {
    Close(false);
    return;
  }
  phase_ = Phase::kIdle;
  parser_.emplace();
  ConfigureParser(*parser_, t_->opts.max_header_bytes, t_->opts.max_request_bytes);
  if (buf_.size() > 0) {
    ReadHeader();
    return;
  }
  stream_.expires_after(t_->opts.idle_timeout);
  stream_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
    if (self->phase_ == Phase::kClosed) return;
    if (ec) {
      if (ec == beast::error::timeout) ++self->t_->idle_to;
      self->Close(false);
      return;
    }
    self->buf_.commit(n);
    self->ReadHeader();
  });
}

void Connection::ReadHeader() {
  phase_ = Phase::kHeader;
  stream_.expires_after(t_->opts.header_timeout);
  http::async_read_header(stream_, buf_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
}

void Connection::FailRequest(int status, const std::string& message, const std::string& code) {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kHandling;
  keep_alive_ = false;
  Enqueue(t_->ErrorResponse(status, message, code), true);
}

void Connection::OnHeader(beast::error_code ec) {
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    if (ec == beast::error::timeout) ++t_->header_to;  // the socket is closed by the timeout
    const HttpParseError e = ClassifyParseError(ec, t_->opts.max_header_bytes, t_->opts.max_request_bytes);
    if (e.status == 0) Close(false);
    else FailRequest(e.status, e.message, e.code);
    return;
  }
  ReadBody();
  // "Expect: 100-continue": the client waits for this before sending the body.
  const auto& msg = parser_->get();
  const auto expect = msg[http::field::expect];
  if (!parser_->is_done() && IEquals(std::string_view(expect.data(), expect.size()), "100-continue") &&
      msg.version() >= 11)
    Enqueue("HTTP/1.1 100 Continue\r\n\r\n", false);
}

void Connection::ReadBody() {
  phase_ = Phase::kBody;
  if (parser_->is_done()) {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->OnBody({}); });
    return;
  }
  stream_.expires_after(t_->opts.body_timeout);
  http::async_read(stream_, buf_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->OnBody(ec); });
}

void Connection::OnBody(beast::error_code ec) {
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    if (ec == beast::error::timeout) ++t_->body_to;
    const HttpParseError e = ClassifyParseError(ec, t_->opts.max_header_bytes, t_->opts.max_request_bytes);
    if (e.status == 0) Close(false);
    else FailRequest(e.status, e.message, e.code);
    return;
  }
  auto msg = parser_->release();
  parser_.reset();
  const bool keep_alive = msg.keep_alive();
  HttpRequest req = ToHttpRequest(std::move(msg));
  keep_alive_ = keep_alive;
  phase_ = Phase::kHandling;
  auto exchange = std::make_shared<ExchangeImpl>(std::move(req), shared_from_this(), keep_alive_);
  exchange_ = exchange;
  in_exchange_ = true;
  ++t_->requests;
  StartMonitor();
  std::shared_ptr<HttpExchange> ex = std::move(exchange);
  auto t = t_;
  net::post(*t_->pool, [t, ex]() mutable {
    try {
      t->handler(std::move(ex));
    } catch (const std::exception& e) {
      spdlog::error("HTTP handler: {}", e.what());
    }
  });
}

void Connection::StartMonitor() {
  // Watch the socket while the request is handled: EOF or an error = the client is gone.
  // Bytes that arrive (a pipelined request) are kept for the next request, up to a bound.
  if (monitor_pending_ || phase_ != Phase::kHandling || buf_.size() >= t_->opts.max_header_bytes) return;
  monitor_pending_ = true;
  stream_.expires_never();  // no deadline for this read (a pending write keeps its own)
  stream_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->OnMonitor(ec, n);
  });
}

void Connection::OnMonitor(beast::error_code ec, size_t n) {
  monitor_pending_ = false;
  if (!ec) buf_.commit(n);
  if (phase_ == Phase::kClosed) return;
  if (phase_ == Phase::kLinger) {
    if (ec) {
      Close(false);
      return;
    }
    buf_.consume(buf_.size());
    LingerRead();
    return;
  }
  if (restart_after_monitor_) {
    restart_after_monitor_ = false;
    if (!ec || ec == net::error::operation_aborted) NextRequest();
    else Close(false);
    return;
  }
  if (ec) {
    if (phase_ == Phase::kHandling && in_exchange_) ++t_->disconnects;
    Close(true);
    return;
  }
  StartMonitor();
}

void Connection::Enqueue(std::string bytes, bool ends_response) {
  if (phase_ == Phase::kClosed || phase_ == Phase::kLinger) return;
  wq_.push_back(Pending{std::move(bytes), ends_response});
  if (!writing_) DoWrite();
}

void Connection::DoWrite() {
  if (wq_.empty()) return;
  if (wq_.front().bytes.empty()) {  // an empty end marker (HEAD stream, HTTP/1.0 stream end)
    const bool ends = wq_.front().ends_response;
    wq_.pop_front();
    if (ends) EndExchange();
    if (phase_ != Phase::kClosed && phase_ != Phase::kLinger && !wq_.empty()) DoWrite();
    return;
  }
  writing_ = true;
  stream_.expires_after(t_->opts.write_timeout);
  net::async_write(stream_, net::buffer(wq_.front().bytes),
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->OnWrite(ec); });
}

void Connection::OnWrite(beast::error_code ec) {
  writing_ = false;
  if (phase_ == Phase::kClosed) return;
  if (ec) {
    if (ec == beast::error::timeout) ++t_->write_to;
    else if (in_exchange_) ++t_->disconnects;
    Close(true);
    return;
  }
  const bool ends = wq_.front().ends_response;
  wq_.pop_front();
  if (ends) EndExchange();
  if (phase_ != Phase::kClosed && phase_ != Phase::kLinger && !wq_.empty()) DoWrite();
}

void Connection::EndExchange() {
  if (auto ex = exchange_.lock()) ex->Detach();
  exchange_.reset();
  in_exchange_ = false;
  if (!keep_alive_ || stopping()) {
    Linger();
    return;
  }
  if (monitor_pending_) {
    restart_after_monitor_ = true;
    beast::error_code ignored;
    stream_.socket().cancel(ignored);
  } else {
    NextRequest();
  }
}

void Connection::Linger() {
  phase_ = Phase::kLinger;
  wq_.clear();
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  // At most one second, then close whatever the client does.
  auto timer = std::make_shared<net::steady_timer>(stream_.get_executor(), std::chrono::seconds(1));
  timer->async_wait([self = shared_from_this(), timer](beast::error_code) { self->Close(false); });
  if (!monitor_pending_) LingerRead();  // else the pending read goes on as the lingering read (OnMonitor)
}

void Connection::LingerRead() {
  monitor_pending_ = true;
  stream_.expires_never();
  buf_.consume(buf_.size());
  stream_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->OnMonitor(ec, n);
  });
}

void Connection::Close(bool client_gone) {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  (void)client_gone;
  if (auto ex = exchange_.lock()) ex->MarkClosed();
  exchange_.reset();
  in_exchange_ = false;
  if (!writing_) wq_.clear();  // (a write in flight still points into wq_.front())
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.close();
  --t_->open;
  t_->Forget(this);
}

// ---------------------------------------------------------------------------

void HttpTransport::Impl::DoAccept() {
  acceptor.async_accept(net::make_strand(io), [self = shared_from_this()](beast::error_code ec, tcp::socket s) {
    if (self->stopping) return;
    if (ec) {
      if (ec == net::error::operation_aborted) return;
      // E.g. out of file descriptors: back off instead of spinning.
      spdlog::warn("HTTP accept failed: {}", ec.message());
      auto timer = std::make_shared<net::steady_timer>(self->io, std::chrono::milliseconds(100));
      timer->async_wait([self, timer](beast::error_code) {
        if (!self->stopping) self->DoAccept();
      });
      return;
    }
    ++self->accepted;
    if (self->open.load() >= self->max_connections) {
      self->Reject(std::move(s));
    } else {
      beast::error_code ignored;
      s.set_option(tcp::no_delay(true), ignored);
      ++self->open;
      auto c = std::make_shared<Connection>(std::move(s), self);
      {
        std::lock_guard<std::mutex> lock(self->conns_mu);
        self->conns.emplace(c.get(), c);
      }
      c->Start();
    }
    self->DoAccept();
  });
}

void HttpTransport::Impl::Reject(tcp::socket s) {
  ++rejected;
  struct Rejected {
    tcp::socket sock;
    std::string bytes;
  };
  auto r = std::make_shared<Rejected>(Rejected{std::move(s), ErrorResponse(503,
                                                  fmt::format("the server has reached its limit of {} open "
                                                              "connections; retry later",
                                                              max_connections),
                                                  "too_many_connections")});
  net::async_write(r->sock, net::buffer(r->bytes), [r](beast::error_code, size_t) {
    beast::error_code ignored;
    r->sock.shutdown(tcp::socket::shutdown_both, ignored);
    r->sock.close(ignored);
  });
}

HttpTransport::HttpTransport(HttpTransportOptions options, Handler handler, ErrorBodyFn error_body)
    : impl_(std::make_shared<Impl>()) {
  if (options.io_threads < 1) Fail(ErrorKind::kInvalidArgument, "HTTP I/O threads must be >= 1, got {}", options.io_threads);
  if (options.handler_threads < 1)
    Fail(ErrorKind::kInvalidArgument, "HTTP handler threads must be >= 1, got {}", options.handler_threads);
  if (options.max_connections < 1)
    Fail(ErrorKind::kInvalidArgument, "--max-connections must be >= 1, got {}", options.max_connections);
  impl_->opts = std::move(options);
  impl_->handler = std::move(handler);
  impl_->error_body = std::move(error_body);
  // Each connection is one file descriptor: raise the soft limit to the hard
  // one, and keep a reserve for the model files, the listener and the rest.
  rlimit rl{};
  int64_t fd_limit = 1024;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rlimit up = rl;
      up.rlim_cur = rl.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
    }
    fd_limit = rl.rlim_cur == RLIM_INFINITY ? INT32_MAX : static_cast<int64_t>(rl.rlim_cur);
  }
  const int64_t usable = std::max<int64_t>(16, fd_limit - 128);
  impl_->max_connections = static_cast<int>(std::min<int64_t>(impl_->opts.max_connections, usable));
  if (impl_->max_connections < impl_->opts.max_connections)
    spdlog::warn("--max-connections {} lowered to {} (open-file limit {})", impl_->opts.max_connections,
                 impl_->max_connections, fd_limit);
}

HttpTransport::~HttpTransport() { Stop(); }

int HttpTransport::Bind() {
  Impl& m = *impl_;
  beast::error_code ec;
  const auto addr = net::ip::make_address(m.opts.host, ec);
  if (ec) Fail(ErrorKind::kInvalidArgument, "cannot bind {}:{}: not an IP address ({})", m.opts.host, m.opts.port, ec.message());
  const tcp::endpoint ep(addr, static_cast<unsigned short>(m.opts.port));
  m.acceptor.open(ep.protocol(), ec);
  if (!ec) m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(ep, ec);
  if (!ec) m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    beast::error_code ignored;
    m.acceptor.close(ignored);
    if (m.opts.port == 0) Fail(ErrorKind::kInvalidArgument, "cannot bind {}:<any port> ({})", m.opts.host, ec.message());
    Fail(ErrorKind::kInvalidArgument, "cannot bind {}:{} ({}: port in use or address not available)", m.opts.host,
         m.opts.port, ec.message());
  }
  return m.acceptor.local_endpoint().port();
}

void HttpTransport::Start() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.stop_mu);
  if (m.started) return;
  m.started = true;
  m.work.emplace(m.io.get_executor());
  m.pool.emplace(static_cast<size_t>(m.opts.handler_threads));
  net::post(m.io, [self = impl_] { self->DoAccept(); });
  for (int i = 0; i < m.opts.io_threads; ++i) m.threads.emplace_back([&m] { m.io.run(); });
}

void HttpTransport::Post(std::function<void()> fn) {
  if (!impl_->pool) return;
  net::post(*impl_->pool, std::move(fn));
}

void HttpTransport::Stop() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.stop_mu);
  if (m.stopped) return;
  m.stopped = true;
  m.stopping = true;
  if (!m.started) {
    beast::error_code ignored;
    m.acceptor.close(ignored);
    return;
  }
  net::post(m.io, [&m] {
    beast::error_code ignored;
    m.acceptor.close(ignored);
  });
  auto live = [&m] {
    std::vector<std::shared_ptr<Connection>> v;
    std::lock_guard<std::mutex> l(m.conns_mu);
    for (auto& [p, w] : m.conns)
      if (auto c = w.lock()) v.push_back(std::move(c));
    return v;
  };
  // Connections without a request in progress close now; the others close
  // once their response is written (a stream ended by the server's shutdown
  // event, say), for up to 2 s; then every one is closed.
  for (auto& c : live()) c->PostCloseIfIdle();
  const auto grace = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (m.open.load() > 0 && std::chrono::steady_clock::now() < grace)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (auto& c : live()) c->PostClose();
  m.work.reset();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!m.io.stopped() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.io.stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
  m.pool->join();
}

HttpTransportCounters HttpTransport::counters() const {
  const Impl& m = *impl_;
  HttpTransportCounters c;
  c.open_connections = m.open;
  c.accepted = m.accepted;
  c.rejected_over_limit = m.rejected;
  c.idle_timeouts = m.idle_to;
  c.header_timeouts = m.header_to;
  c.body_timeouts = m.body_to;
  c.write_timeouts = m.write_to;
  c.client_disconnects = m.disconnects;
  c.requests = m.requests;
  return c;
}

int HttpTransport::max_connections() const { return impl_->max_connections; }

}  // namespace deepinfer::server
