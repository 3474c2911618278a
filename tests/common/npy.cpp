#include "npy.h"

#include <cstdlib>
#include <cstring>
#include <fstream>

namespace selscan_test {

namespace {
// Value of `key` in the header dict, e.g. 'descr': '<f4'  ->  '<f4' (with quotes / parentheses kept).
std::string dict_value(const std::string& h, const std::string& key) {
  const size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) return {};
  size_t v = h.find(':', k);
  if (v == std::string::npos) return {};
  ++v;
  while (v < h.size() && h[v] == ' ') ++v;
  size_t e = v;
  if (h[v] == '(') e = h.find(')', v) + 1;
  else if (h[v] == '\'') e = h.find('\'', v + 1) + 1;
  else e = h.find_first_of(",}", v);
  return h.substr(v, e - v);
}

// Opens `path` and reads its header: descr ("'<f4'", quotes kept), shape; leaves `f` at the data.
std::string read_header(const std::string& path, std::ifstream& f, std::string* descr, std::vector<int64_t>* shape) {
  f.open(path, std::ios::binary);
  if (!f) return "cannot open " + path;
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) return path + ": not an .npy file";
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t hlen = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) return path + ": truncated header";
    hlen = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) return path + ": truncated header";
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    return path + ": unsupported .npy version " + std::to_string(major);
  }
  std::string header(hlen, '\0');
  if (!f.read(&header[0], hlen)) return path + ": truncated header";

  *descr = dict_value(header, "descr");
  if (dict_value(header, "fortran_order") != "False") return path + ": Fortran order is not supported";

  const std::string sh = dict_value(header, "shape");  // "(2, 8, 64)" or "(8,)" or "()"
  shape->clear();
  for (size_t i = 1; i < sh.size();) {
    while (i < sh.size() && (sh[i] == ' ' || sh[i] == ',')) ++i;
    if (i >= sh.size() || sh[i] == ')') break;
    size_t j = i;
    while (j < sh.size() && sh[j] >= '0' && sh[j] <= '9') ++j;
    if (j == i) return path + ": bad shape " + sh;
    shape->push_back(std::stoll(sh.substr(i, j - i)));
    i = j;
  }
  // The files are little-endian; so is every host we build for (checked once here).
  const uint32_t one = 1;
  unsigned char first;
  std::memcpy(&first, &one, 1);
  if (first != 1) return "big-endian hosts are not supported by the .npy reader";
  return {};
}
}  // namespace

std::string read_npy(const std::string& path, NpyArray* out) {
  std::ifstream f;
  std::string descr;
  const std::string err = read_header(path, f, &descr, &out->shape);
  if (!err.empty()) return err;
  if (descr == "'<f4'") out->is_complex = false;
  else if (descr == "'<c8'") out->is_complex = true;
  else return path + ": dtype " + descr + " is not little-endian float32 or complex64";
  const int64_t n = out->numel() * (out->is_complex ? 2 : 1);
  out->data.resize(static_cast<size_t>(n));
  if (!f.read(reinterpret_cast<char*>(out->data.data()), static_cast<std::streamsize>(n * 4)))
    return path + ": truncated data";
  return {};
}

std::string read_npy_raw(const std::string& path, NpyRaw* out) {
  std::ifstream f;
  std::string descr;
  const std::string err = read_header(path, f, &descr, &out->shape);
  if (!err.empty()) return err;
  if (descr.size() != 5 || descr[1] != '<' || (descr[2] != 'f' && descr[2] != 'u' && descr[2] != 'i') ||
      (descr[3] != '2' && descr[3] != '4' && descr[3] != '8'))
    return path + ": dtype " + descr + " is not a little-endian float, int or uint of 2, 4 or 8 bytes";
  out->descr = descr.substr(1, 3);
  out->esize = descr[3] - '0';
  out->bytes.resize(static_cast<size_t>(out->numel() * out->esize));
  if (!f.read(reinterpret_cast<char*>(out->bytes.data()), static_cast<std::streamsize>(out->bytes.size())))
    return path + ": truncated data";
  return {};
}

std::string golden_dir() {
  if (const char* env = std::getenv("SELSCAN_GOLDEN_DIR"); env != nullptr && *env != '\0') return env;
#ifdef SELSCAN_GOLDEN_DIR
  return SELSCAN_GOLDEN_DIR;
#else
  return "tests/data/golden";  // relative to the repository root
#endif
}

}  // namespace selscan_test
