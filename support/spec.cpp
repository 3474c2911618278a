#include "support/spec.h"

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "support/dtype.h"

namespace selscan_support {

std::string CaseSpec::str() const {
  std::string s = fmt::format("Bt={} D={} L={} N={} G={} itype={} {} B={} C={}", batch, dim, seqlen, dstate, groups,
                              dtype_name(itype), complex ? "complex" : "real", var_B ? "var" : "const",
                              var_C ? "var" : "const");
  if (has_D) s += " +D";
  if (has_z) s += " +z";
  if (has_delta_bias) s += " +bias";
  if (softplus) s += " +softplus";
  if (has_h0) s += " +h0";
  if (deterministic) s += " deterministic";
  if (bc_3d) s += " bc3d";
  if (strides == Strides::mamba_inner) s += " strides=inner";
  if (strides == Strides::padded) s += " strides=padded";
  if (slow_decay) s += " slow";
  return s + fmt::format(" delta=[{},{}) seed={}", delta_lo, delta_hi, seed);
}

std::string CaseSpec::shape_text() const {
  std::string s = fmt::format("{}x{}x{}:{}", batch, dim, seqlen, dstate);
  if (groups > 1) s += fmt::format(":{}", groups);
  return s;
}

std::string CaseSpec::flags_text() const {
  std::string s;
  auto add = [&](const char* w) { s += (s.empty() ? "" : ", ") + std::string(w); };
  if (var_B && var_C) add("var B/C");
  else if (var_B) add("var B, const C");
  else if (var_C) add("const B, var C");
  else add("const B/C");
  if (has_D) add("D");
  if (has_z) add("z");
  if (has_delta_bias) add("delta_bias");
  if (softplus) add("softplus");
  return s;
}

CaseSpec case_spec(int64_t batch, int64_t dim, int64_t seqlen, int64_t dstate, int32_t itype, int64_t groups) {
  CaseSpec s;
  s.batch = batch;
  s.dim = dim;
  s.seqlen = seqlen;
  s.dstate = dstate;
  s.itype = itype;
  s.groups = groups;
  return s;
}

bool parse_shape(const std::string& text, CaseSpec* s, std::string* err) {
  int64_t v[5] = {0, 0, 0, 0, 1};
  const char seps[5] = {'x', 'x', ':', ':', '\0'};
  const char* p = text.c_str();
  int n = 0;
  for (; n < 5; ++n) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(p, &end, 10);
    if (end == p || errno != 0 || x < 1) break;
    v[n] = x;
    p = end;
    if (*p == '\0') {
      ++n;
      break;
    }
    if (*p != seps[n]) {
      n = -1;
      break;
    }
    ++p;
  }
  if (n < 4 || *p != '\0') {
    *err = fmt::format("bad shape '{}': expected BtxDxL:N or BtxDxL:N:G with positive integers (e.g. 8x1536x2048:16)",
                       text);
    return false;
  }
  if (v[1] % v[4] != 0) {
    *err = fmt::format("bad shape '{}': the groups G={} must divide D={}", text, v[4], v[1]);
    return false;
  }
  s->batch = v[0];
  s->dim = v[1];
  s->seqlen = v[2];
  s->dstate = v[3];
  s->groups = v[4];
  return true;
}

}  // namespace selscan_support
