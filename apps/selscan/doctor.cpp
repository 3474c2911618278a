// `selscan doctor`: the checklist people run by hand when a selective-scan build breaks, automated.
// Library (version, path, what it was built with and carries), driver, devices, the CUDA installs and paths
// that decide what a rebuild or a load picks up, then a forward+backward self-test on the CPU and each GPU.
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "cli.h"
#include "support/cuda_driver.h"
#include "json.h"

namespace selscan_cli {

namespace {

// ------------------------------------------------------------------------------------------- report
enum class Level { ok, info, warn, fail };
const char* level_name(Level l) {
  switch (l) {
    case Level::ok: return "ok";
    case Level::info: return "info";
    case Level::warn: return "warn";
    default: return "FAIL";
  }
}

struct Item {
  std::string section;
  Level level;
  std::string text;
};

class Report {
 public:
  void section(const std::string& s) { section_ = s; }
  void add(Level l, std::string text) { items_.push_back({section_, l, std::move(text)}); }
  int count(Level l) const {
    int n = 0;
    for (const Item& i : items_) n += i.level == l;
    return n;
  }
  const std::vector<Item>& items() const { return items_; }

 private:
  std::string section_;
  std::vector<Item> items_;
};

// ------------------------------------------------------------------------------------------- helpers
struct Version {
  int major = -1, minor = -1;
  bool valid() const { return major >= 0; }
  std::string text() const { return valid() ? fmt::format("{}.{}", major, minor) : "unknown"; }
  bool operator==(const Version& o) const { return major == o.major && minor == o.minor; }
  bool operator<(const Version& o) const { return major != o.major ? major < o.major : minor < o.minor; }
};

// First "X.Y" at or after `from` in s.
Version parse_version(const std::string& s, size_t from = 0) {
  for (size_t i = from; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) continue;
    size_t j = i;
    int a = 0, b = 0;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) a = a * 10 + (s[j++] - '0');
    if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
      ++j;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) b = b * 10 + (s[j++] - '0');
      return {a, b};
    }
    i = j;
  }
  return {};
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool is_dir(const std::string& p) {
  struct stat st{};
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st{};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
std::string real_path(const std::string& p) {
  char* r = realpath(p.c_str(), nullptr);
  if (r == nullptr) return p;
  std::string s = r;
  std::free(r);
  return s;
}
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
// stdout of a command (stderr discarded); "" when it cannot run.
std::string capture(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[512];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::string find_on_path(const std::string& exe) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (const std::string& dir : split(path, ':')) {
    const std::string p = (dir.empty() ? "." : dir) + "/" + exe;
    if (is_file(p) && access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// The toolkit version of a CUDA install: version.json, version.txt, else its nvcc.
Version toolkit_version(const std::string& root) {
  const std::string json = read_file(root + "/version.json");
  if (!json.empty()) {
    const size_t c = json.find("\"cuda\"");
    const size_t v = c == std::string::npos ? c : json.find("\"version\"", c);
    if (v != std::string::npos) return parse_version(json, v);
  }
  const std::string txt = read_file(root + "/version.txt");
  if (!txt.empty()) return parse_version(txt);
  if (is_file(root + "/bin/nvcc")) {
    const std::string out = capture(shell_quote(root + "/bin/nvcc") + " --version");
    const size_t r = out.find("release ");
    if (r != std::string::npos) return parse_version(out, r);
  }
  return {};
}

// The mapped files of this process whose name contains `needle` (e.g. "libcudart.so").
std::vector<std::string> mapped_libraries(const std::string& needle) {
  std::set<std::string> found;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const size_t base = path.rfind('/');
    if (path.find(needle, base) != std::string::npos) found.insert(path);
  }
  return {found.begin(), found.end()};
}

// The oldest NVIDIA driver branch that runs code built with CUDA `built`: from CUDA 11 on, a driver of the
// major version's first branch runs every minor release of it (minor-version compatibility; NVIDIA's table:
// 11.x >= 450.80.02, 12.x >= 525, 13.x >= 580). "" for a toolkit this table does not cover.
std::string min_driver(const Version& built) {
  switch (built.major) {
    case 11: return "R450 (450.80.02)";
    case 12: return "R525";
    case 13: return "R580";
    default: return "";
  }
}

// How to get a library that an older driver runs: the same source built with an older toolkit.
constexpr const char kOlderDriverHint[] =
    "for an older driver build with an older toolkit (CUDA 12.x runs on R525+, 11.8 on R450+): put its nvcc on "
    "PATH and run `SELSCAN_CUDA_ARCH_LIST=\"8.0;9.0+PTX\" pip install --no-binary selscan selscan`, or "
    "`cmake --workflow --preset cuda-12.4`";

// ------------------------------------------------------------------------------------------- facts
struct LibraryFacts {
  std::string path, version_string, build_info;
  int32_t version = 0;
  std::string cuda_toolkit;  // from build_info: "13.0" or "none"
  std::string sass, ptx;     // from build_info
};

struct DriverFacts {
  bool loaded = false, initialised = false;
  std::string message, libcuda_path, kernel_module;
  int cuda_version = 0;
};

struct EnvFacts {
  std::vector<std::pair<std::string, std::string>> installs;  // path, version
  std::string cuda_symlink;                                    // target of /usr/local/cuda
  std::string nvcc_path, nvcc_version, cxx;
  std::string cuda_home, cuda_home_var;
  std::vector<std::string> ld_dirs;
  std::vector<std::string> other_selscan, cudart_on_ld, cudart_loaded;
  std::string shadowed;  // this program's own libselscan, when another one was loaded
};

// "name X; ..." field of build_info after `key ` ("CUDA 13.0" -> "13.0").
std::string info_field(const std::string& info, const std::string& key) {
  for (std::string part : split(info, ';')) {
    while (!part.empty() && part.front() == ' ') part.erase(part.begin());
    if (part.rfind(key + " ", 0) == 0) return part.substr(key.size() + 1);
  }
  return "";
}

LibraryFacts library_facts(Report& r) {
  r.section("Library");
  LibraryFacts f;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&selscan_version), &info) != 0 && info.dli_fname != nullptr)
    f.path = real_path(info.dli_fname);
  f.version_string = selscan_version_string();
  f.version = selscan_version();
  f.build_info = selscan_build_info();
  f.cuda_toolkit = info_field(f.build_info, "CUDA");
  f.sass = info_field(f.build_info, "SASS");
  f.ptx = info_field(f.build_info, "PTX");
  r.add(Level::ok, fmt::format("libselscan {} loaded from {}", f.version_string, f.path.empty() ? "?" : f.path));
  const int hv = SELSCAN_VERSION;
  auto vtext = [](int v) { return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100); };
  if (f.version == hv) {
    r.add(Level::ok, fmt::format("header version {} matches the library", vtext(hv)));
  } else if (f.version / 100 == hv / 100) {
    r.add(Level::warn, fmt::format("header version {} but library {} (patch level differs)", vtext(hv),
                                   vtext(f.version)));
  } else {
    r.add(Level::fail, fmt::format("header version {} but library {}: this program was built against another "
                                   "libselscan than the one loaded (check LD_LIBRARY_PATH below)",
                                   vtext(hv), vtext(f.version)));
  }
  r.add(Level::info, fmt::format("build: {}", f.build_info));
  if (f.cuda_toolkit.empty() || f.cuda_toolkit == "none") {
    r.add(Level::info, "CPU-only build (no CUDA): GPUs are not used; the CUDA presets build the GPU path");
  } else {
    const Version built = parse_version(f.cuda_toolkit);
    const std::string floor = min_driver(built);
    if (!floor.empty())
      r.add(Level::info, fmt::format("built with CUDA {}: its GPU path needs an NVIDIA driver {} or newer; {}",
                                     built.text(), floor, kOlderDriverHint));
  }
  // Kernel-choice overrides (docs/abi.md): results stay within tolerance, but timings differ from a default run.
  for (const char* var :
       {"SELSCAN_FWD_KERNEL", "SELSCAN_BWD_KERNEL", "SELSCAN_DECODE_KERNEL", "SELSCAN_CPU_KERNELS"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0')
      r.add(Level::info, fmt::format("{}={} is set: kernel choice forced (meant for A/B runs; unset it for the "
                                     "default choice)", var, v));
  }
  return f;
}

DriverFacts driver_facts(Report& r, const LibraryFacts& lib) {
  r.section("Driver");
  DriverFacts f;
  const Driver& d = driver();
  const DriverState& st = driver_state();
  f.loaded = d.loaded;
  f.libcuda_path = d.path.empty() ? "" : real_path(d.path);
  std::string mod = read_file("/sys/module/nvidia/version");
  if (mod.empty()) {
    const std::string proc = read_file("/proc/driver/nvidia/version");
    const size_t k = proc.find("Kernel Module");
    if (k != std::string::npos) mod = parse_version(proc, k).valid() ? first_line(proc.substr(k + 14)) : "";
  }
  while (!mod.empty() && (mod.back() == '\n' || mod.back() == ' ')) mod.pop_back();
  f.kernel_module = mod;
  if (!d.loaded) {
    f.message = d.why;
    r.add(Level::info, fmt::format("no NVIDIA driver: {}. GPU checks are skipped; the CPU path is tested below", d.why));
    return f;
  }
  f.cuda_version = st.version;
  f.initialised = st.available;
  r.add(Level::ok, fmt::format("libcuda {}{}", f.libcuda_path,
                               f.kernel_module.empty() ? "" : fmt::format(" (kernel module {})", f.kernel_module)));
  if (f.libcuda_path.find("/stubs/") != std::string::npos)
    r.add(Level::fail, "libcuda.so.1 resolves to the toolkit's link-time stub, not the driver: remove the stubs "
                       "directory from LD_LIBRARY_PATH");
  r.add(Level::ok, fmt::format("the driver supports CUDA up to {}", cuda_version_text(st.version)));
  if (!st.available) {
    f.message = st.message;
    r.add(Level::fail, fmt::format("the driver is installed but does not initialise: {}", st.message));
    return f;
  }
  const Version built = parse_version(lib.cuda_toolkit);
  const Version drv{st.version / 1000, (st.version % 1000) / 10};
  if (built.valid()) {
    if (drv.major < built.major)
      r.add(Level::fail, fmt::format("libselscan was built with CUDA {} but the driver supports only CUDA {}: "
                                     "update the driver{}, or rebuild with a CUDA {}.x toolkit: {}",
                                     built.text(), drv.text(),
                                     min_driver(built).empty() ? "" : " to " + min_driver(built) + " or newer",
                                     drv.major, kOlderDriverHint));
    else if (drv < built)
      r.add(Level::warn, fmt::format("built with CUDA {}, driver supports {}: runs under minor-version "
                                     "compatibility, but PTX cannot be JIT-compiled; update the driver if a device "
                                     "needs PTX", built.text(), drv.text()));
    else
      r.add(Level::ok, fmt::format("the driver is new enough for the build's CUDA {}", built.text()));
  }
  return f;
}

std::vector<DeviceInfo> device_facts(Report& r, const DriverFacts& drv) {
  r.section("Devices");
  std::vector<DeviceInfo> devs = list_devices();
  if (!drv.loaded) {
    r.add(Level::info, "no CUDA devices (no driver)");
    return devs;
  }
  if (devs.empty()) r.add(Level::info, "the driver shows no CUDA device (check CUDA_VISIBLE_DEVICES)");
  int32_t lib_count = -1;
  if (selscan_cuda_device_count(&lib_count) == SELSCAN_STATUS_SUCCESS && lib_count != int32_t(devs.size()) &&
      lib_count != 0)
    r.add(Level::warn, fmt::format("the driver shows {} device(s) but libselscan sees {}", devs.size(), lib_count));
  for (const DeviceInfo& d : devs) {
    const std::string what = fmt::format("cuda:{} {}, sm_{}{}, {} SMs, {}", d.index, d.name, d.sm_major, d.sm_minor,
                                         d.sm_count, human_bytes(double(d.total_mem)));
    if (d.usable())
      r.add(Level::ok, what + ": this build runs on it");
    else if (d.check == SELSCAN_STATUS_CUDA_NOT_BUILT)
      r.add(Level::warn, fmt::format("{}: not used, {}", what, d.check_message));
    else
      r.add(Level::fail, fmt::format("{}: this build cannot run on it: {}", what, d.check_message));
  }
  return devs;
}

EnvFacts env_facts(Report& r, const LibraryFacts& lib) {
  r.section("Environment");
  EnvFacts f;
  const Version built = parse_version(lib.cuda_toolkit);
  // Toolkits installed side by side: the usual source of "built with one, linked with another".
  // Aliases (cuda-13 -> cuda-13.0) are one install: count real directories.
  std::set<std::string> seen;
  for (const std::string& name : list_dir("/usr/local")) {
    if (name.rfind("cuda", 0) != 0) continue;
    const std::string p = "/usr/local/" + name;
    if (!is_dir(p)) continue;
    if (name == "cuda") {
      f.cuda_symlink = real_path(p);
      continue;
    }
    const std::string real = real_path(p);
    if (!seen.insert(real).second) continue;
    f.installs.emplace_back(real, toolkit_version(real).text());
  }
  if (!f.cuda_symlink.empty() && seen.insert(f.cuda_symlink).second)
    f.installs.emplace_back(f.cuda_symlink, toolkit_version(f.cuda_symlink).text());
  if (f.installs.empty() && f.cuda_symlink.empty()) {
    r.add(Level::info, "no CUDA toolkit under /usr/local (only needed to build the GPU path)");
  } else {
    std::string list;
    for (const auto& [p, v] : f.installs) list += fmt::format("{}{} ({})", list.empty() ? "" : ", ", p, v);
    r.add(f.installs.size() > 1 ? Level::warn : Level::info,
          fmt::format("{} CUDA install(s): {}{}", f.installs.size(), list,
                      f.installs.size() > 1 ? "; pick one explicitly (a preset or CUDAToolkit_ROOT) when rebuilding"
                                            : ""));
    if (!f.cuda_symlink.empty())
      r.add(Level::info, fmt::format("/usr/local/cuda -> {}", f.cuda_symlink));
  }
  f.nvcc_path = find_on_path("nvcc");
  Version nvcc;
  if (f.nvcc_path.empty()) {
    r.add(Level::info, "no nvcc on PATH (only needed to rebuild the GPU path)");
  } else {
    const std::string out = capture(shell_quote(f.nvcc_path) + " --version");
    const size_t rel = out.find("release ");
    nvcc = rel == std::string::npos ? Version{} : parse_version(out, rel);
    f.nvcc_version = nvcc.text();
    if (built.valid() && nvcc.valid() && !(nvcc == built))
      r.add(Level::warn, fmt::format("nvcc on PATH is {} ({}) but libselscan was built with CUDA {}: a rebuild "
                                     "from this shell would use {}", f.nvcc_path, nvcc.text(), built.text(),
                                     nvcc.text()));
    else
      r.add(Level::ok, fmt::format("nvcc on PATH: {} (CUDA {})", f.nvcc_path, nvcc.text()));
  }
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* v = std::getenv(var);
    if (v == nullptr || *v == '\0') continue;
    f.cuda_home = v;
    f.cuda_home_var = var;
    break;
  }
  if (f.cuda_home.empty()) {
    r.add(Level::info, "CUDA_HOME is not set (not needed: presets find the toolkit)");
  } else if (!is_dir(f.cuda_home)) {
    r.add(Level::warn, fmt::format("{}={} does not exist", f.cuda_home_var, f.cuda_home));
  } else {
    const Version home = toolkit_version(f.cuda_home);
    if (nvcc.valid() && home.valid() && !(home == nvcc))
      r.add(Level::warn, fmt::format("{}={} is CUDA {} but nvcc on PATH is {}: tools disagree on the toolkit",
                                     f.cuda_home_var, f.cuda_home, home.text(), nvcc.text()));
    else
      r.add(Level::ok, fmt::format("{}={} (CUDA {})", f.cuda_home_var, f.cuda_home, home.text()));
  }
  const std::string cxx = find_on_path("c++");
  if (!cxx.empty()) {
    f.cxx = first_line(capture(shell_quote(cxx) + " --version"));
    r.add(Level::info, fmt::format("c++ on PATH: {}", f.cxx));
  }

  // LD_LIBRARY_PATH: another libselscan there can shadow the intended one; a libcudart there matters only
  // if the library uses a shared runtime (it links it statically, so normally none is loaded).
  const char* ld = std::getenv("LD_LIBRARY_PATH");
  const std::string loaded = lib.path;
  if (ld != nullptr && *ld != '\0') {
    for (const std::string& dir : split(ld, ':')) {
      if (dir.empty()) continue;
      f.ld_dirs.push_back(dir);
      for (const std::string& name : list_dir(dir)) {
        const std::string p = dir + "/" + name;
        if (name.rfind("libselscan.so", 0) == 0 && real_path(p) != loaded) f.other_selscan.push_back(p);
        if (name.rfind("libcudart.so", 0) == 0) f.cudart_on_ld.push_back(p);
      }
    }
  }
  f.cudart_loaded = mapped_libraries("libcudart.so");
  // The copy this program was built to use sits next to it (build tree) or in ../lib (install); one loaded
  // from elsewhere means LD_LIBRARY_PATH (or the loader cache) shadowed it.
  const std::string exe = real_path("/proc/self/exe");
  const std::string exe_dir = exe.substr(0, exe.rfind('/'));
  for (const std::string& dir : {exe_dir, exe_dir + "/../lib", exe_dir + "/../lib64"}) {
    for (const std::string& name : list_dir(dir)) {
      if (name.rfind("libselscan.so", 0) != 0) continue;
      const std::string p = real_path(dir + "/" + name);
      if (p != loaded && f.shadowed.empty()) f.shadowed = p;
    }
  }
  if (!f.shadowed.empty() && !loaded.empty())
    r.add(Level::warn, fmt::format("this program's own libselscan ({}) is shadowed: {} was loaded instead "
                                   "(LD_LIBRARY_PATH or the loader cache)", f.shadowed, loaded));
  if (!f.other_selscan.empty()) {
    std::string list;
    for (const std::string& p : f.other_selscan) list += (list.empty() ? "" : ", ") + p;
    r.add(Level::warn, fmt::format("another libselscan on LD_LIBRARY_PATH ({}); this program loaded {}: "
                                   "programs started from this shell may get either",
                                   list, loaded));
  } else {
    r.add(Level::ok, f.ld_dirs.empty() ? "LD_LIBRARY_PATH is empty: no libselscan or libcudart can be shadowed"
                                       : "no other libselscan on LD_LIBRARY_PATH");
  }
  if (!f.cudart_loaded.empty()) {
    r.add(Level::info, fmt::format("a shared CUDA runtime is loaded: {}", f.cudart_loaded.front()));
  } else if (!f.cudart_on_ld.empty()) {
    r.add(Level::info, fmt::format("libcudart on LD_LIBRARY_PATH ({}) is not used: {}", f.cudart_on_ld.front(),
                                   built.valid() ? "libselscan links the CUDA runtime statically"
                                                 : "this libselscan has no CUDA"));
  }
  return f;
}

// ------------------------------------------------------------------------------------------- self-test
struct SelfTestCase {
  const char* label;
  CaseSpec spec;
};

std::vector<SelfTestCase> self_test_cases() {
  std::vector<SelfTestCase> cases;
  // Full upstream feature set, groups, an odd length.
  cases.push_back({"fp32 var B/C G=2, D, z, bias, softplus", case_spec(2, 8, 777, 8, SELSCAN_DTYPE_FLOAT32, 2)});
  // Two chunks (the carry through x), constant B (the h/B convention of x), bf16.
  SelfTestCase c2{"bf16 const B, var C, 2 chunks", case_spec(1, 4, 2500, 16, SELSCAN_DTYPE_BFLOAT16)};
  c2.spec.var_B = false;
  c2.spec.has_z = false;
  cases.push_back(c2);
  // fp16, no D, no softplus, var B with constant C.
  SelfTestCase c3{"fp16 var B, const C, z, no D/softplus", case_spec(2, 6, 100, 4, SELSCAN_DTYPE_FLOAT16)};
  c3.spec.var_C = false;
  c3.spec.has_D = false;
  c3.spec.softplus = false;
  cases.push_back(c3);
  // Constant B and C together, deterministic backward.
  SelfTestCase c4{"fp32 const B/C, deterministic bwd", case_spec(3, 4, 64, 16, SELSCAN_DTYPE_FLOAT32)};
  c4.spec.var_B = c4.spec.var_C = false;
  c4.spec.has_delta_bias = false;
  c4.spec.deterministic = true;
  cases.push_back(c4);
  return cases;
}

std::string worst_text(const std::vector<Agreement>& as) {
  const Agreement* worst = nullptr;
  for (const Agreement& a : as)
    if (worst == nullptr || !(a.score <= worst->score)) worst = &a;
  if (worst == nullptr) return "-";
  return fmt::format("worst {} {} (tol {})", worst->name, sci(worst->score), sci(worst->tol));
}

std::string failures_text(const std::vector<Agreement>& as) {
  std::string s;
  for (const Agreement& a : as)
    if (!a.pass) s += fmt::format("{}{} {} > {}", s.empty() ? "" : ", ", a.name, sci(a.score), sci(a.tol));
  return s;
}

void agreements_json(Json& j, const char* key, const std::vector<Agreement>& as) {
  j.array(key);
  for (const Agreement& a : as)
    j.object().str("tensor", a.name).num("score", a.score).num("max_abs", a.max_abs).num("tol", a.tol)
        .boolean("pass", a.pass).end();
  j.end();
}

}  // namespace

int cmd_doctor(const std::vector<std::string>& args) {
  bool json = false;
  Options opt(args);
  std::string name;
  while (opt.next(&name)) {
    if (name == "--json") json = true;
    else opt.set_error(fmt::format("unknown option {} (selscan doctor [--json])", name));
  }
  if (!opt.error().empty()) {
    fmt::print(stderr, "selscan doctor: {}\n", opt.error());
    return kExitUsage;
  }

  Report r;
  const LibraryFacts lib = library_facts(r);
  const DriverFacts drv = driver_facts(r, lib);
  const std::vector<DeviceInfo> devs = device_facts(r, drv);
  const EnvFacts env = env_facts(r, lib);

  r.section("Self-test");
  if (!json) fmt::print(stderr, "selscan doctor: running the self-test...\n");
  const double fd = reference_gradient_check(self_test_cases()[0].spec, 3, 7);
  r.add(fd < 1e-5 ? Level::ok : Level::fail,
        fmt::format("the tool's float64 reference: gradients vs central finite differences {}", sci(fd)));
  std::vector<CaseCheck> checks;
  bool any_gpu = false;
  for (const SelfTestCase& c : self_test_cases()) {
    const HostData in = make_inputs(c.spec, 42);
    Reference ref;
    reference_forward_backward(c.spec, in, &ref, 1);
    const std::string label = fmt::format("{} [{}]", c.label, c.spec.shape_text());
    CaseCheck cpu = check_case(label, c.spec, Target{}, in, ref, nullptr, "");
    auto record = [&](const CaseCheck& k, const std::string& vs) {
      if (!k.ran)
        r.add(Level::fail, fmt::format("{:<7} {}: could not run: {}", k.device, label, k.error));
      else if (k.pass())
        r.add(Level::ok, fmt::format("{:<7} {}: fwd+bwd {}", k.device, label, vs));
      else
        r.add(Level::fail, fmt::format("{:<7} {}: {}", k.device, label,
                                       failures_text(k.vs_ref) + (k.vs_other.empty() ? "" : "; ") +
                                           failures_text(k.vs_other)));
    };
    record(cpu, "vs float64: " + worst_text(cpu.vs_ref));
    std::vector<CaseCheck> gpu;
    for (const DeviceInfo& d : devs) {
      if (!d.usable()) continue;
      any_gpu = true;
      Target t;
      t.kind = SELSCAN_DEVICE_CUDA;
      t.index = d.index;
      gpu.push_back(check_case(label, c.spec, t, in, ref, cpu.ran ? &cpu.outputs : nullptr, "cpu"));
      record(gpu.back(), "vs cpu: " + worst_text(gpu.back().vs_other) + "; vs float64: " +
                             worst_text(gpu.back().vs_ref));
    }
    checks.push_back(std::move(cpu));
    for (CaseCheck& g : gpu) checks.push_back(std::move(g));
  }
  if (!any_gpu) r.add(Level::info, "no usable GPU: the self-test ran on the CPU only");

  const int fails = r.count(Level::fail), warns = r.count(Level::warn);
  const bool ok = fails == 0;
  if (json) {
    Json j;
    j.object();
    j.boolean("ok", ok).integer("failures", fails).integer("warnings", warns);
    j.object("library")
        .str("path", lib.path).str("version", lib.version_string).integer("version_number", lib.version)
        .integer("header_version", SELSCAN_VERSION).str("build_info", lib.build_info)
        .str("cuda_toolkit", lib.cuda_toolkit).str("sass", lib.sass).str("ptx", lib.ptx)
        .str("min_driver", min_driver(parse_version(lib.cuda_toolkit))).end();
    j.object("driver").boolean("loaded", drv.loaded).boolean("initialised", drv.initialised)
        .str("libcuda", drv.libcuda_path).str("kernel_module", drv.kernel_module);
    if (drv.cuda_version > 0) j.str("cuda_version", cuda_version_text(drv.cuda_version));
    else j.null("cuda_version");
    j.str("message", drv.message).end();
    j.array("devices");
    for (const DeviceInfo& d : devs)
      j.object().integer("index", d.index).str("name", d.name).str("sm", fmt::format("{}.{}", d.sm_major, d.sm_minor))
          .integer("memory_bytes", int64_t(d.total_mem)).integer("sm_count", d.sm_count)
          .boolean("usable", d.usable()).str("status", selscan_status_string(d.check))
          .str("message", d.check_message).end();
    j.end();
    j.object("environment");
    j.array("cuda_installs");
    for (const auto& [p, v] : env.installs) j.object().str("path", p).str("version", v).end();
    j.end();
    j.str("cuda_symlink", env.cuda_symlink).str("nvcc", env.nvcc_path).str("nvcc_version", env.nvcc_version)
        .str("cuda_home", env.cuda_home).str("cxx", env.cxx);
    j.array("ld_library_path");
    for (const std::string& s : env.ld_dirs) j.str(nullptr, s);
    j.end();
    j.str("shadowed_libselscan", env.shadowed);
    j.array("other_libselscan");
    for (const std::string& s : env.other_selscan) j.str(nullptr, s);
    j.end();
    j.array("libcudart_on_ld_library_path");
    for (const std::string& s : env.cudart_on_ld) j.str(nullptr, s);
    j.end();
    j.array("libcudart_loaded");
    for (const std::string& s : env.cudart_loaded) j.str(nullptr, s);
    j.end();
    j.end();
    j.object("self_test").num("reference_fd_rel_err", fd);
    j.array("cases");
    for (const CaseCheck& k : checks) {
      j.object().str("case", k.label).str("device", k.device).boolean("ran", k.ran).boolean("pass", k.pass());
      if (!k.ran) j.str("error", k.error);
      agreements_json(j, "vs_float64", k.vs_ref);
      if (!k.vs_other.empty()) agreements_json(j, "vs_cpu", k.vs_other);
      j.end();
    }
    j.end().end();
    j.array("checks");
    for (const Item& i : r.items())
      j.object().str("section", i.section).str("level", level_name(i.level)).str("message", i.text).end();
    j.end();
    j.end();
    fmt::print("{}", j.text());
  } else {
    fmt::print("selscan doctor\n");
    std::string section;
    for (const Item& i : r.items()) {
      if (i.section != section) {
        section = i.section;
        fmt::print("\n{}\n", section);
      }
      fmt::print("  {:<5} {}\n", level_name(i.level), i.text);
    }
    fmt::print("\n{}: {} failure(s), {} warning(s)\n", ok ? "OK" : "BROKEN", fails, warns);
  }
  return ok ? kExitOk : kExitFail;
}

}  // namespace selscan_cli
