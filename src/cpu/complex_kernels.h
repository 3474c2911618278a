// Complex-weight counterparts of the kernels in kernels.h (plain scalar code; complex weights are rare).
#pragma once

#include "common.h"
#include "kernels.h"

namespace selscan::cpu {

using CFwdBlock = FwdBlockT<cfloat>;
using CBwdChunk = BwdChunkT<cfloat>;

void cfwd_block(const CFwdBlock& k, bool var_B, bool var_C, bool with_P);
void cbwd_chunk(const CBwdChunk& k, bool var_B, bool var_C, bool fold_B);

}  // namespace selscan::cpu
