// A small streaming JSON writer (objects, arrays, strings, numbers, booleans, null), indented two spaces.
// Non-finite numbers are written as null, since JSON has no NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace selscan_cli {

class Json {
 public:
  Json& object(const char* key = nullptr) { return open(key, '{'); }
  Json& array(const char* key = nullptr) { return open(key, '['); }
  Json& end() {
    const char c = stack_.back().close;
    const bool empty = stack_.back().first;
    stack_.pop_back();
    if (!empty) newline();
    out_ += c;
    return *this;
  }
  Json& str(const char* key, const std::string& v) {
    prefix(key);
    quote(v);
    return *this;
  }
  Json& num(const char* key, double v) {
    prefix(key);
    out_ += std::isfinite(v) ? fmt::format("{}", v) : std::string("null");
    return *this;
  }
  Json& integer(const char* key, int64_t v) {
    prefix(key);
    out_ += fmt::format("{}", v);
    return *this;
  }
  Json& boolean(const char* key, bool v) {
    prefix(key);
    out_ += v ? "true" : "false";
    return *this;
  }
  Json& null(const char* key) {
    prefix(key);
    out_ += "null";
    return *this;
  }
  // The finished document (all containers closed), with a trailing newline.
  std::string text() const { return out_ + "\n"; }

 private:
  struct Level {
    char close;
    bool first;
  };
  Json& open(const char* key, char c) {
    prefix(key);
    out_ += c;
    stack_.push_back({c == '{' ? '}' : ']', true});
    return *this;
  }
  void newline() {
    out_ += '\n';
    out_.append(2 * stack_.size(), ' ');
  }
  void prefix(const char* key) {
    if (!stack_.empty()) {
      if (!stack_.back().first) out_ += ',';
      stack_.back().first = false;
      newline();
    }
    if (key != nullptr) {
      quote(key);
      out_ += ": ";
    }
  }
  void quote(const std::string& s) {
    out_ += '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\t': out_ += "\\t"; break;
        case '\r': out_ += "\\r"; break;
        default:
          if (c < 0x20) out_ += fmt::format("\\u{:04x}", c);
          else out_ += char(c);
      }
    }
    out_ += '"';
  }
  std::string out_;
  std::vector<Level> stack_;
};

}  // namespace selscan_cli
