#include "golden.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace selscan_test {

namespace fs = std::filesystem;

namespace {

// The raw text of a key's value in a flat JSON object ("2", "true", "\"fp32\"", "null"); "" if missing.
std::string json_raw(const std::string& text, const std::string& key) {
  const size_t k = text.find("\"" + key + "\"");
  if (k == std::string::npos) return {};
  size_t v = text.find(':', k);
  if (v == std::string::npos) return {};
  ++v;
  while (v < text.size() && std::isspace(static_cast<unsigned char>(text[v]))) ++v;
  size_t e = v;
  if (v < text.size() && text[v] == '"') e = text.find('"', v + 1) + 1;
  else e = text.find_first_of(",}\n", v);
  std::string r = text.substr(v, e - v);
  while (!r.empty() && std::isspace(static_cast<unsigned char>(r.back()))) r.pop_back();
  return r;
}

int32_t itype_of(const std::string& s) {
  if (s == "\"fp16\"") return SELSCAN_DTYPE_FLOAT16;
  if (s == "\"bf16\"") return SELSCAN_DTYPE_BFLOAT16;
  return SELSCAN_DTYPE_FLOAT32;
}

}  // namespace

std::vector<std::string> golden_case_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(golden_dir(), ec))
    if (e.is_directory() && fs::exists(e.path() / "case.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

bool golden_exists(const std::string& name) { return fs::exists(fs::path(golden_dir()) / name / "case.json"); }

std::string load_golden_case(const std::string& name, GoldenCase* g, Case* c) {
  const std::string err = load_golden(name, g);
  return err.empty() ? golden_to_case(*g, c) : err;
}

std::string load_golden(const std::string& name, GoldenCase* g) {
  g->name = name;
  g->dir = (fs::path(golden_dir()) / name).string();
  std::ifstream f(fs::path(g->dir) / "case.json");
  if (!f) return "cannot read " + g->dir + "/case.json";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string j = ss.str();
  auto num = [&](const char* k, int64_t dflt) {
    const std::string r = json_raw(j, k);
    return (r.empty() || r == "null") ? dflt : std::stoll(r);
  };
  auto flag = [&](const char* k) { return json_raw(j, k) == "true"; };
  CaseSpec& s = g->spec;
  s.batch = num("batch", 1);
  s.dim = num("dim", 1);
  s.seqlen = num("seqlen", 1);
  s.dstate = num("dstate", 1);
  s.groups = num("groups", 1);
  s.itype = itype_of(json_raw(j, "itype"));
  s.complex = json_raw(j, "wtype") == "\"complex64\"";
  s.var_B = flag("variable_B");
  s.var_C = flag("variable_C");
  s.has_D = flag("has_D");
  s.has_z = flag("has_z");
  s.has_delta_bias = flag("has_delta_bias");
  s.softplus = flag("delta_softplus");
  s.has_h0 = false;
  s.seed = static_cast<uint64_t>(num("seed", 0));
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(g->dir, ec)) {
    if (e.path().extension() != ".npy") continue;
    NpyArray a;
    const std::string err = read_npy(e.path().string(), &a);
    if (!err.empty()) return err;
    g->files[e.path().stem().string()] = std::move(a);
  }
  if (g->files.empty()) return "no .npy files in " + g->dir;
  return {};
}

std::vector<double> golden_values(const GoldenCase& g, const std::string& stem) {
  auto it = g.files.find(stem);
  if (it == g.files.end()) return {};
  return std::vector<double>(it->second.data.begin(), it->second.data.end());
}

std::string golden_to_case(const GoldenCase& g, Case* out) {
  CaseSpec s = g.spec;
  s.with_x = true;
  s.with_last_state = true;
  Case c = make_case(s);  // random inputs of the right shapes, replaced below
  auto load = [&](const char* stem, Tensor& t) -> std::string {
    if (!t.present()) return {};
    auto it = g.files.find(stem);
    if (it == g.files.end()) return g.name + ": missing " + stem + ".npy";
    const NpyArray& a = it->second;
    if (a.numel() != t.numel() || static_cast<size_t>(t.ndim()) != a.shape.size())
      return g.name + ": " + stem + ".npy has a shape unlike the case";
    std::vector<int64_t> idx(t.sizes.size(), 0);
    for (int64_t k = 0; k < a.numel(); ++k) {
      if (a.is_complex) t.setc(idx, cd(a.data[2 * k], a.data[2 * k + 1]));
      else t.set(idx, a.data[static_cast<size_t>(k)]);
      for (int i = static_cast<int>(idx.size()) - 1; i >= 0; --i) {
        if (++idx[i] < t.sizes[i]) break;
        idx[i] = 0;
      }
    }
    return {};
  };
  for (auto& [stem, t] : std::vector<std::pair<const char*, Tensor*>>{{"u", &c.u},
                                                                     {"delta", &c.delta},
                                                                     {"A", &c.A},
                                                                     {"B", &c.B},
                                                                     {"C", &c.C},
                                                                     {"D", &c.D},
                                                                     {"z", &c.z},
                                                                     {"delta_bias", &c.delta_bias},
                                                                     {"dout", &c.dout}}) {
    const std::string err = load(stem, *t);
    if (!err.empty()) return err;
  }
  *out = std::move(c);
  return {};
}

}  // namespace selscan_test
