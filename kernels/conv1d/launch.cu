// The conv1d launchers declared in src/cuda/launch.h: the itype switch to the instances of f32.cu, f16.cu, bf16.cu.
#include "cuda/launch.h"

namespace selscan::kern::conv1d {
using cuda::Conv1dPlan;
using cuda::Launch;
Status fwd_f32(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status fwd_f16(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status fwd_bf16(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status bwd_f32(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status bwd_f16(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status bwd_bf16(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status update_f32(const Conv1dUpdate& p, const Conv1dPlan& plan, const Launch& l);
Status update_f16(const Conv1dUpdate& p, const Conv1dPlan& plan, const Launch& l);
Status update_bf16(const Conv1dUpdate& p, const Conv1dPlan& plan, const Launch& l);
}  // namespace selscan::kern::conv1d

namespace selscan::cuda {

Status launch_conv1d_fwd(const Conv1d& p, const Conv1dPlan& plan, const Launch& l) {
  switch (p.itype) {
    case Dtype::f32: return kern::conv1d::fwd_f32(p, plan, l);
    case Dtype::f16: return kern::conv1d::fwd_f16(p, plan, l);
    case Dtype::bf16: return kern::conv1d::fwd_bf16(p, plan, l);
    default: break;
  }
  return fail(SELSCAN_STATUS_INTERNAL, "conv1d forward launcher: itype is not f32/f16/bf16");
}

Status launch_conv1d_bwd(const Conv1d& p, const Conv1dPlan& plan, const Launch& l) {
  switch (p.itype) {
    case Dtype::f32: return kern::conv1d::bwd_f32(p, plan, l);
    case Dtype::f16: return kern::conv1d::bwd_f16(p, plan, l);
    case Dtype::bf16: return kern::conv1d::bwd_bf16(p, plan, l);
    default: break;
  }
  return fail(SELSCAN_STATUS_INTERNAL, "conv1d backward launcher: itype is not f32/f16/bf16");
}

Status launch_conv1d_update(const Conv1dUpdate& p, const Conv1dPlan& plan, const Launch& l) {
  switch (p.itype) {
    case Dtype::f32: return kern::conv1d::update_f32(p, plan, l);
    case Dtype::f16: return kern::conv1d::update_f16(p, plan, l);
    case Dtype::bf16: return kern::conv1d::update_bf16(p, plan, l);
    default: break;
  }
  return fail(SELSCAN_STATUS_INTERNAL, "conv1d update launcher: itype is not f32/f16/bf16");
}

}  // namespace selscan::cuda
