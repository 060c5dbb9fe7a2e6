// deepinfer tokenize / detokenize — the model directory's tokenizer on stdin.
//
//   deepinfer tokenize --model DIR [--no-special]          UTF-8 text on stdin → [ids] (BOS added unless --no-special)
//   deepinfer tokenize --model DIR --chat [--thinking] [--no-generation-prompt]
//                      [--reasoning-effort E] [--chat-format v4|v41]
//                                                         JSON messages array on stdin → rendered, then
//                                                         tokenized without adding special tokens (one BOS)
//   deepinfer detokenize --model DIR [--skip-special]      JSON array of ids on stdin → text (exactly, no newline)
//
// Invalid UTF-8 on stdin is an error naming the byte offset (exit 2).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "commands.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::cli {

namespace {

std::string ReadStdin() {
  std::string s((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  return s;
}

std::string ReadStdinUtf8() {
  std::string s = ReadStdin();
  if (const size_t bad = utf8::FirstInvalid(s); bad != std::string_view::npos)
    Fail(ErrorKind::kInvalidArgument, "stdin is not valid UTF-8: invalid byte 0x{:02X} at byte offset {}",
         static_cast<unsigned char>(s[bad]), bad);
  return s;
}

// model_type from MODEL_DIR/config.json ("" if absent or unreadable).
std::string ModelType(const std::string& dir) {
  std::FILE* f = std::fopen((dir + "/config.json").c_str(), "rb");
  if (!f) return "";
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  std::fclose(f);
  try {
    const auto j = nlohmann::json::parse(s);
    return j.is_object() && j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>()
                                                                                    : "";
  } catch (const nlohmann::json::exception&) {
    return "";
  }
}

void PrintIds(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void RegisterTokenize(CLI::App& app) {
  struct Opts {
    std::string model, chat_format, effort;
    bool no_special = false, chat = false, thinking = false, no_gen = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("tokenize", "Tokenize UTF-8 text (or a chat with --chat) read from stdin; prints a JSON array of ids");
  cmd->add_option("--model", o->model, "Model directory (tokenizer.json, tokenizer_config.json)")->required();
  cmd->add_flag("--no-special", o->no_special, "Do not add special tokens (BOS)");
  cmd->add_flag("--chat", o->chat, "stdin is a JSON array of chat messages; render it first (DeepSeek-V4/V4.1 format)");
  cmd->add_flag("--thinking", o->thinking, "With --chat: thinking mode (<think>) instead of chat mode");
  cmd->add_flag("--no-generation-prompt", o->no_gen, "With --chat: leave out the final <｜Assistant｜> header");
  cmd->add_option("--reasoning-effort", o->effort, "With --chat: V4.1 1..100|low|high|max, V4 high|max");
  cmd->add_option("--chat-format", o->chat_format, "With --chat: v4 or v41 (default: from config.json model_type, else v41)")
      ->check(CLI::IsMember({"v4", "v41"}));
  cmd->callback([o] {
    const Tokenizer tok = Tokenizer::Load(o->model);
    if (!o->chat) {
      PrintIds(tok.Encode(ReadStdinUtf8(), !o->no_special));
      return;
    }
    const std::string input = ReadStdinUtf8();
    nlohmann::ordered_json messages;
    try {
      messages = nlohmann::ordered_json::parse(input);
    } catch (const nlohmann::json::exception& e) {
      Fail(ErrorKind::kInvalidArgument, "stdin is not a JSON messages array ({})", e.what());
    }
    ChatOptions co;
    if (!o->chat_format.empty()) {
      co.encoding = o->chat_format == "v4" ? ChatEncoding::kDeepseekV4 : ChatEncoding::kDeepseekV41;
    } else if (const std::string mt = ModelType(o->model); !mt.empty()) {
      co.encoding = ChatEncodingForModelType(mt);
    }
    co.thinking = o->thinking;
    co.add_generation_prompt = !o->no_gen;
    if (!o->effort.empty()) {
      const bool numeric = o->effort.find_first_not_of("0123456789") == std::string::npos && o->effort.size() < 10;
      co.reasoning_effort = numeric ? nlohmann::ordered_json(std::stoll(o->effort)) : nlohmann::ordered_json(o->effort);
    }
    // The rendered prompt carries the BOS; --no-special drops it.
    co.add_bos = !o->no_special;
    PrintIds(EncodeChat(tok, messages, co));
  });
}

void RegisterDetokenize(CLI::App& app) {
  struct Opts {
    std::string model;
    bool skip_special = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("detokenize", "Decode a JSON array of token ids read from stdin; prints the text");
  cmd->add_option("--model", o->model, "Model directory (tokenizer.json)")->required();
  cmd->add_flag("--skip-special", o->skip_special, "Leave out special tokens");
  cmd->callback([o] {
    const Tokenizer tok = Tokenizer::Load(o->model);
    const std::string input = ReadStdinUtf8();
    std::vector<int32_t> ids;
    try {
      const auto j = nlohmann::json::parse(input);
      if (!j.is_array()) throw std::runtime_error("not an array");
      for (const auto& v : j) {
        if (!v.is_number_integer()) throw std::runtime_error("element " + v.dump() + " is not an integer");
        const int64_t x = v.get<int64_t>();
        if (x < INT32_MIN || x > INT32_MAX) Fail(ErrorKind::kOutOfRange, "token id {} is out of range", x);
        ids.push_back(static_cast<int32_t>(x));
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      Fail(ErrorKind::kInvalidArgument, "stdin is not a JSON array of token ids ({})", e.what());
    }
    const std::string text = tok.Decode(ids, o->skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
  });
}

}  // namespace deepinfer::cli
