// The ABI struct builders of support/abi.h, under the tests' namespace.
#pragma once

#include "support/abi.h"

namespace selscan_test {
using selscan_support::bwd_args_with_inputs_of;
using selscan_support::contiguous_desc;
}  // namespace selscan_test
