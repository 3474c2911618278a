// A small JSON reader for test data (tests/data/*/cases.json): objects keep their key order, numbers are doubles
// (exact for the integers test data holds). Parse errors name the byte offset.
#pragma once

#include <cctype>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace selscan_test {

struct Json {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> items;                            // array
  std::vector<std::pair<std::string, Json>> members;  // object, in file order

  bool is(Kind k) const { return kind == k; }
  // The member `key` of an object, or nullptr (also when this is not an object).
  const Json* find(const std::string& key) const {
    if (kind != Kind::object) return nullptr;
    for (const auto& [k, v] : members)
      if (k == key) return &v;
    return nullptr;
  }
};

namespace json_detail {

struct Parser {
  explicit Parser(const std::string& text) : s(text) {}
  const std::string& s;
  size_t i = 0;
  std::string err;

  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool fail(const std::string& what) {
    if (err.empty()) err = what + " at byte " + std::to_string(i);
    return false;
  }
  bool lit(const char* word) {
    const std::string w(word);
    if (s.compare(i, w.size(), w) != 0) return fail("expected '" + w + "'");
    i += w.size();
    return true;
  }
  bool string(std::string* out) {
    if (i >= s.size() || s[i] != '"') return fail("expected a string");
    ++i;
    out->clear();
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (c == '\\') {
        if (i >= s.size()) break;
        const char e = s[i++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case 'b': c = '\b'; break;
          case 'f': c = '\f'; break;
          case 'u': return fail("\\u escapes are not supported");
          default: c = e;  // \" \\ \/
        }
      }
      out->push_back(c);
    }
    if (i >= s.size()) return fail("unterminated string");
    ++i;
    return true;
  }
  bool value(Json* v, int depth) {
    if (depth > 64) return fail("nesting too deep");
    ws();
    if (i >= s.size()) return fail("unexpected end");
    const char c = s[i];
    if (c == '{') {
      v->kind = Json::Kind::object;
      ++i;
      ws();
      if (i < s.size() && s[i] == '}') return ++i, true;
      for (;;) {
        ws();
        std::string key;
        if (!string(&key)) return false;
        ws();
        if (i >= s.size() || s[i] != ':') return fail("expected ':'");
        ++i;
        v->members.emplace_back(std::move(key), Json{});
        if (!value(&v->members.back().second, depth + 1)) return false;
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == '}') return ++i, true;
        return fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v->kind = Json::Kind::array;
      ++i;
      ws();
      if (i < s.size() && s[i] == ']') return ++i, true;
      for (;;) {
        v->items.emplace_back();
        if (!value(&v->items.back(), depth + 1)) return false;
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == ']') return ++i, true;
        return fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v->kind = Json::Kind::string;
      return string(&v->str);
    }
    if (c == 't' || c == 'f') {
      v->kind = Json::Kind::boolean;
      v->b = c == 't';
      return lit(v->b ? "true" : "false");
    }
    if (c == 'n') return lit("null");
    const char* begin = s.c_str() + i;
    char* end = nullptr;
    v->num = std::strtod(begin, &end);
    if (end == begin) return fail("unexpected character");
    v->kind = Json::Kind::number;
    i += static_cast<size_t>(end - begin);
    return true;
  }
};

}  // namespace json_detail

// Parses `text` into *out; returns "" or what is wrong and where.
inline std::string parse_json(const std::string& text, Json* out) {
  json_detail::Parser p(text);
  *out = Json{};
  if (!p.value(out, 0)) return p.err;
  p.ws();
  if (p.i != text.size()) return "trailing characters at byte " + std::to_string(p.i);
  return {};
}

}  // namespace selscan_test
