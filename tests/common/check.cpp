#include "check.h"

namespace selscan_test {

namespace {
void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& ref, Tol tol,
                  const std::vector<double>* bound = nullptr) {
  EXPECT_TRUE(allclose(what, got, ref, tol, bound));
}
}  // namespace

void check_case(const CaseSpec& spec, const selscan_exec_t& exec, const DeviceMemory* dev, bool bwd,
                double tol_scale) {
  SCOPED_TRACE(spec.str());
  Case c = make_case(spec);
  std::vector<std::vector<unsigned char>> inputs_before;
  for (Tensor* t : c.inputs()) inputs_before.push_back(t->storage);

  ASSERT_EQ(run_fwd(c, exec, dev), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (auto& [name, t] : c.named_fwd_outputs()) {
    const std::string err = t->check_written(kPoison, kPoison);
    EXPECT_TRUE(err.empty()) << name << ": " << err;
  }
  const RefProblem rp = ref_problem(c);
  const RefFwd f = ref_forward(rp, /*with_cond=*/true);
  Tolerances tol = upstream_tolerances(spec.itype, spec.has_z, spec.var_B, spec.var_C);
  for (Tol* t : {&tol.out, &tol.last_state, &tol.du, &tol.ddelta, &tol.dA, &tol.dB, &tol.dC, &tol.dD, &tol.dz,
                 &tol.ddelta_bias, &tol.dh0, &tol.x})
    *t = t->scaled(tol_scale, tol_scale);
  const int32_t it = spec.itype;
  // out / out_z: upstream's tolerance, or k u cond where larger (docs/numerics.md), scaled like the rest.
  const std::vector<double> ay = cond_bound(f.cond_y, tol_scale);
  const std::vector<double> az = spec.has_z ? cond_bound(f.cond_out_z, tol_scale) : std::vector<double>();
  expect_close("out", c.out.values(), round_to(f.y, it), tol.out, &ay);
  if (spec.has_z) expect_close("out_z", c.out_z.values(), round_to(f.out_z, it), tol.out, &az);
  if (spec.with_last_state)
    expect_close("last_state", c.last_state.values(), flatten(f.last_state, spec.complex), tol.last_state);
  if (spec.with_x) expect_close("x", c.x.values(), ref_x_values(f, c), tol.x);
  if (!bwd) return;

  ASSERT_EQ(run_bwd(c, exec, true, dev), SELSCAN_STATUS_SUCCESS) << selscan_last_error();
  for (auto& [name, t] : c.named_bwd_outputs()) {
    const std::string err = t->check_written(kPoison, kPoison);
    EXPECT_TRUE(err.empty()) << name << ": " << err;
  }
  const RefBwd g = ref_backward(rp, ref_dout(c), /*with_cond=*/true);
  const bool cx = spec.complex;
  expect_close("du", c.du.values(), round_to(g.du, it), tol.du);
  expect_close("ddelta", c.ddelta.values(), round_to(g.ddelta, it), tol.ddelta);
  // The reduced gradients (sums over batch and time, or over a group's channels): upstream's tolerance, or
  // k u cond where larger (docs/numerics.md, "Conditioning-aware tolerance of the reduced gradients").
  const std::vector<double> bA = cond_bound(flatten_cond(g.cond_dA, cx), tol_scale);
  const std::vector<double> bB = cond_bound(flatten_cond(g.cond_dB, cx), tol_scale);
  const std::vector<double> bC = cond_bound(flatten_cond(g.cond_dC, cx), tol_scale);
  const std::vector<double> bD = cond_bound(g.cond_dD, tol_scale), bbias = cond_bound(g.cond_dbias, tol_scale);
  expect_close("dA", c.dA.values(), flatten(g.dA, cx), tol.dA, &bA);
  expect_close("dB", c.dB.values(), spec.var_B ? round_to(flatten(g.dB, cx), it) : flatten(g.dB, cx), tol.dB, &bB);
  expect_close("dC", c.dC.values(), spec.var_C ? round_to(flatten(g.dC, cx), it) : flatten(g.dC, cx), tol.dC, &bC);
  if (spec.has_D) expect_close("dD", c.dD.values(), g.dD, tol.dD, &bD);
  if (spec.has_delta_bias) expect_close("ddelta_bias", c.ddelta_bias.values(), g.dbias, tol.ddelta_bias, &bbias);
  if (spec.has_z) expect_close("dz", c.dz.values(), round_to(g.dz, it), tol.dz);
  if (c.dh0.present()) expect_close("dh0", c.dh0.values(), flatten(g.dh0, cx), tol.dh0);
  if (c.out_z_bwd.present())
    expect_close("out_z(bwd)", c.out_z_bwd.values(), round_to(f.out_z, it), tol.out, &az);

  // Inputs are read-only (bytes, guards and gaps included).
  std::vector<Tensor*> ins = c.inputs();
  for (size_t i = 0; i < ins.size(); ++i) EXPECT_TRUE(ins[i]->storage == inputs_before[i]) << "input " << i << " modified";
}

}  // namespace selscan_test
