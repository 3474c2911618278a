// selscan: command-line companion of libselscan (doctor, bench, run). Uses only the public C ABI, plus the
// CUDA driver API loaded at run time, so the same binary works with and without a GPU or driver.
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli.h"

namespace {

const char* kHelp =
    "usage: selscan <command> [options]\n"
    "\n"
    "commands:\n"
    "  doctor [--json]   check the library, driver, GPUs and CUDA installs, then self-test forward+backward on\n"
    "                    the CPU and every usable GPU; exits 1 when something is broken\n"
    "  run               forward + backward on a default shape (2x768x1024:16 fp32), with timings and the\n"
    "                    agreement of every output and gradient with a float64 reference; exits 1 on disagreement\n"
    "  bench             median forward/backward times and GB/s of the benchmark shapes (or --shape ...)\n"
    "  --version         print the tool's and the library's versions and build\n"
    "  --help            this text; `selscan <command> --help` for a command's options\n"
    "\n"
    "Devices: --device cpu | cuda | cuda:N (run, bench). The default is the first GPU this build runs on,\n"
    "else the CPU. Exit codes: 0 ok, 1 a check failed, 2 bad usage or the requested device is unusable.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace selscan_cli;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    fmt::print(stderr, "{}", kHelp);
    return kExitUsage;
  }
  const std::string cmd = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    fmt::print("{}", kHelp);
    return kExitOk;
  }
  if (cmd == "--version" || cmd == "-V" || cmd == "version") {
    fmt::print("selscan {} (header {}.{}.{}; library {})\n", selscan_version_string(), SELSCAN_VERSION_MAJOR,
               SELSCAN_VERSION_MINOR, SELSCAN_VERSION_PATCH, selscan_build_info());
    return kExitOk;
  }
  if (cmd == "doctor") {
    for (const std::string& a : rest)
      if (a == "--help" || a == "-h") {
        fmt::print("usage: selscan doctor [--json]\n"
                   "Checks the library (version, path, CUDA toolkit and targets it carries), the driver and the\n"
                   "highest CUDA it supports, every GPU and whether this build runs on it (with the rebuild\n"
                   "command when not), CUDA installs, nvcc, CUDA_HOME and LD_LIBRARY_PATH, then runs forward +\n"
                   "backward on the CPU (against a float64 reference) and on each usable GPU (against the CPU\n"
                   "path). Exit 0: nothing broken (warnings allowed); 1: at least one FAIL line.\n");
        return kExitOk;
      }
    return cmd_doctor(rest);
  }
  if (cmd == "run") return cmd_run(rest);
  if (cmd == "bench") return cmd_bench(rest);
  fmt::print(stderr, "selscan: unknown command '{}'\n\n{}", cmd, kHelp);
  return kExitUsage;
}
