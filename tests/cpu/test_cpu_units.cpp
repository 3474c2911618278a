// Units of the CPU path: the library's 16-bit conversions vs the independent ones of support/dtype.h, the
// accuracy of the kernels' exp2 and softplus (portable and AVX2 builds), and the .npy reader.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <vector>

#include "cpu/common.h"
#include "cpu/kernels.h"
#include "support/dtype.h"
#include "npy.h"

namespace selscan_test {
namespace {

namespace cpu = selscan::cpu;
using namespace selscan_support;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Floats that stress rounding: every 16-bit value, the midpoints between neighbours (ties), one float ulp
// either side of them, overflow/underflow boundaries, and random floats over the whole range.
std::vector<float> conversion_probes(bool bf16) {
  std::vector<float> v;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float a = bf16 ? bf16_to_float(static_cast<uint16_t>(h)) : f16_to_float(static_cast<uint16_t>(h));
    const float b = bf16 ? bf16_to_float(static_cast<uint16_t>(h + 1)) : f16_to_float(static_cast<uint16_t>(h + 1));
    v.push_back(a);
    if (std::isfinite(a) && std::isfinite(b) && std::signbit(a) == std::signbit(b)) {
      const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);
      v.push_back(mid);
      v.push_back(std::nextafter(mid, 0.f));
      v.push_back(std::nextafter(mid, INFINITY));
    }
  }
  for (float f : {65504.f, 65519.99f, 65520.f, 65536.f, 1e10f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-30f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(), 0.f, -0.f}) {
    v.push_back(f);
    v.push_back(-f);
  }
  std::mt19937 g(7);
  for (int i = 0; i < 200000; ++i) v.push_back(from_bits(g()));
  return v;
}

TEST(CpuUnits, HalfConversionsAgree) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float lib = cpu::half_to_float(static_cast<uint16_t>(h)), ref = f16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(ref)) EXPECT_TRUE(std::isnan(lib)) << h;
    else ASSERT_EQ(bits(lib), bits(ref)) << "half 0x" << std::hex << h;
  }
  int64_t checked = 0;
  for (float f : conversion_probes(false)) {
    const uint16_t lib = cpu::float_to_half(f), ref = float_to_f16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(lib)));
      continue;
    }
    ASSERT_EQ(lib, ref) << "float " << f << " (0x" << std::hex << bits(f) << ")";
    ++checked;
  }
  EXPECT_GT(checked, 300000);
}

TEST(CpuUnits, Bf16ConversionsAgree) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float lib = cpu::bf16_to_float(static_cast<uint16_t>(h)), ref = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(ref)) EXPECT_TRUE(std::isnan(lib)) << h;
    else ASSERT_EQ(bits(lib), bits(ref)) << "bf16 0x" << std::hex << h;
  }
  for (float f : conversion_probes(true)) {
    const uint16_t lib = cpu::float_to_bf16(f), ref = float_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(lib)));
      continue;
    }
    ASSERT_EQ(lib, ref) << "float " << f << " (0x" << std::hex << bits(f) << ")";
  }
}

std::vector<const cpu::KernelTable*> tables() {
  static const cpu::KernelTable g = cpu::generic::table();
  static const cpu::KernelTable a = cpu::avx2::available() ? cpu::avx2::table() : cpu::KernelTable{};
  std::vector<const cpu::KernelTable*> t{&g};
  if (cpu::avx2::available()) t.push_back(&a);
  return t;
}

// Distance in ulps of float `got` from the exact value `ref` (in units of the float spacing at ref).
double ulps(float got, double ref) {
  const float r = static_cast<float>(ref);
  const double spacing = std::nextafter(std::fabs(r), INFINITY) - std::fabs(r);
  return std::fabs(got - ref) / spacing;
}

TEST(CpuUnits, Exp2Accuracy) {
  for (const cpu::KernelTable* t : tables()) {
    SCOPED_TRACE(t->name);
    double worst = 0.0;
    for (double x = -126.0; x <= 127.99; x += 0.000731) {
      const float xf = static_cast<float>(x);
      worst = std::max(worst, ulps(t->exp2(xf), std::exp2(static_cast<double>(xf))));
    }
    EXPECT_LE(worst, 2.0);
    std::printf("[ accuracy ] exp2 (%s): max %.2f ulp over [-126, 128)\n", t->name, worst);
    EXPECT_EQ(t->exp2(0.f), 1.f);
    EXPECT_EQ(t->exp2(-3.f), 0.125f);
    EXPECT_EQ(t->exp2(-126.5f), 0.f);   // would be subnormal: flushed
    EXPECT_EQ(t->exp2(-1000.f), 0.f);
    EXPECT_EQ(t->exp2(-INFINITY), 0.f);
    EXPECT_EQ(t->exp2(128.5f), INFINITY);
    EXPECT_EQ(t->exp2(INFINITY), INFINITY);
    EXPECT_TRUE(std::isnan(t->exp2(NAN)));
  }
}

TEST(CpuUnits, SoftplusAccuracy) {
  for (const cpu::KernelTable* t : tables()) {
    SCOPED_TRACE(t->name);
    std::vector<float> v;
    for (double x = -40.0; x <= 30.0; x += 0.000917) v.push_back(static_cast<float>(x));
    for (float x : {20.f, std::nextafter(20.f, 0.f), std::nextafter(20.f, 100.f), 0.f, -0.f, 1e-30f, -87.f, -90.f})
      v.push_back(x);
    std::vector<float> out = v;
    t->softplus(out.data(), static_cast<int64_t>(out.size()));
    double worst = 0.0;
    for (size_t i = 0; i < v.size(); ++i) {
      const double x = v[i];
      if (x > 20.0) {
        ASSERT_EQ(out[i], v[i]) << "above the threshold softplus is the identity, x = " << x;
        continue;
      }
      const double ref = std::log1p(std::exp(x));
      if (ref < 1.2e-38) {  // subnormal results flush to zero
        EXPECT_LE(out[i], 1.2e-38f);
        continue;
      }
      worst = std::max(worst, ulps(out[i], ref));
    }
    EXPECT_LE(worst, 4.0);
    std::printf("[ accuracy ] softplus (%s): max %.2f ulp over [-40, 20]\n", t->name, worst);
    float nan_in[3] = {NAN, INFINITY, -INFINITY};
    t->softplus(nan_in, 3);
    EXPECT_TRUE(std::isnan(nan_in[0]));
    EXPECT_EQ(nan_in[1], INFINITY);
    EXPECT_EQ(nan_in[2], 0.f);
  }
}

TEST(CpuUnits, NpyReader) {
  // A hand-written v1.0 file: complex64 of shape (3,).
  const std::string path = ::testing::TempDir() + "selscan_npy_test.npy";
  {
    std::string header = "{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::ofstream f(path, std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    const uint16_t len = static_cast<uint16_t>(header.size());
    f.put(static_cast<char>(len & 0xff));
    f.put(static_cast<char>(len >> 8));
    f << header;
    const float data[6] = {1.f, -1.f, 2.5f, 0.f, -3.f, 4.f};
    f.write(reinterpret_cast<const char*>(data), sizeof data);
  }
  NpyArray a;
  ASSERT_EQ(read_npy(path, &a), "");
  EXPECT_TRUE(a.is_complex);
  ASSERT_EQ(a.shape, std::vector<int64_t>{3});
  ASSERT_EQ(a.data.size(), 6u);
  EXPECT_EQ(a.data[2], 2.5f);
  EXPECT_EQ(a.data[5], 4.f);
  std::remove(path.c_str());
  EXPECT_NE(read_npy(path, &a), "");  // missing file: an error, not a crash

  // A real golden file.
  NpyArray u;
  ASSERT_EQ(read_npy(golden_dir() + "/s01_fp32_basic/u.npy", &u), "") << "golden dir " << golden_dir();
  EXPECT_EQ(u.shape, (std::vector<int64_t>{2, 8, 64}));
  EXPECT_FALSE(u.is_complex);
  EXPECT_EQ(static_cast<int64_t>(u.data.size()), u.numel());
}

}  // namespace
}  // namespace selscan_test
