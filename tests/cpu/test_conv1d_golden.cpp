// causal-conv1d's golden vectors (tests/data/conv1d_golden) against selscan's CPU path: the forward, the
// backward (both reduction modes) and the decode update of every case, at the limits make_goldens.py checked
// upstream with (tests/data/conv1d_golden/README.md once generated). Skipped, saying so, until the set exists;
// a cases.json naming a missing file fails.
#include <gtest/gtest.h>

#include "conv1d_golden.h"

namespace selscan_test {
namespace {

TEST(CpuConv1dGolden, EveryCaseMatchesUpstream) { check_every_conv1d_golden(cpu_exec(2), nullptr); }

}  // namespace
}  // namespace selscan_test
