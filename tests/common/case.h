// A test case: a random problem (a CaseSpec: sizes, flags, dtypes, layouts) with all its host tensors, argument structs
// for selscan_fwd/selscan_bwd over them, and the float64 oracle's view of the inputs. Device-agnostic: the
// argument builders take a pointer map, so a GPU test copies each Tensor's storage to the device, passes the
// device pointers, and copies the outputs back into the same Tensors before comparing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "selscan/selscan.h"
#include "tensor.h"

namespace selscan_test {

struct Case {
  CaseSpec spec;
  Tensor u, delta, A, B, C, D, z, delta_bias, h0;  // inputs
  Tensor out, out_z, x, last_state;               // forward outputs
  Tensor dout;                                    // backward input (gradient of out_z if z, else of out)
  Tensor du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dh0, out_z_bwd;  // backward outputs

  int64_t nchunks() const { return (spec.seqlen + 2047) / 2048; }
  std::vector<Tensor*> inputs();
  std::vector<Tensor*> fwd_outputs();  // present ones only
  std::vector<Tensor*> bwd_outputs();  // present ones only
  std::vector<std::pair<const char*, Tensor*>> named_fwd_outputs();
  std::vector<std::pair<const char*, Tensor*>> named_bwd_outputs();

  // Argument structs; `ptr` maps a present tensor to the base address of its storage where the library will
  // see it (host: storage.data(); device: the device copy). Descriptors point at element 0 of that base.
  using PtrMap = std::function<void*(Tensor&)>;
  selscan_fwd_args_t fwd_args(const PtrMap& ptr);
  selscan_bwd_args_t bwd_args(const PtrMap& ptr, bool deterministic = true);
};

// Random inputs (16-bit itypes: values rounded to the itype), outputs allocated and poisoned.
Case make_case(const CaseSpec& spec);

// "L4500_complex_h0_f16" of the forward GPU matrix (tests/gpu/test_gpu_fwd.cpp, seed 1028 there), its most
// ill-conditioned spec, on which tests/cpu/test_conditioning.cpp pins the conditioning-aware tolerance: slowly
// decaying complex states with h0 over 4500 steps, fp16 inputs. Shared so that both test that very problem.
CaseSpec l4500_complex_h0_f16(uint64_t seed);

// The host pointer map.
void* host_ptr(Tensor& t);

// Fill every byte of the given tensors with kPoison (NaN).
void poison(const std::vector<Tensor*>& ts);

// Device memory for running a Case elsewhere than on host pointers. A device test fills in these callbacks
// (e.g. cudaMalloc / cudaMemcpy / cudaFree / cudaStreamSynchronize); tests/common has no device headers.
struct DeviceMemory {
  std::function<void*(size_t bytes)> alloc;  // must not return NULL for bytes > 0
  std::function<void(void* device_dst, const void* host_src, size_t bytes)> to_device;
  std::function<void(void* host_dst, const void* device_src, size_t bytes)> to_host;
  std::function<void(void* p)> release;
  std::function<void()> sync;  // wait for the call's work (the stream passed in exec)
};

// Host memory posing as a device (malloc and memcpy), counting live allocations in *live: the device runner of the
// GPU suites, tested on the CPU.
DeviceMemory host_device_memory(int* live);

// Poison the forward (backward) outputs and run through the public ABI. With `dev` == nullptr the library
// sees host pointers; otherwise every present tensor's whole storage (guards included) is copied to device
// memory, the call runs on those copies, and all storages come back (so guard checks still apply).
selscan_status_t run_fwd(Case& c, const selscan_exec_t& exec, const DeviceMemory* dev = nullptr);
selscan_status_t run_bwd(Case& c, const selscan_exec_t& exec, bool deterministic = true,
                         const DeviceMemory* dev = nullptr);
// call(ptr) with `ptr` mapping each tensor of `ts` to its storage's base: the host storage (dev == nullptr), or a
// device copy of every present one, copied back (after dev->sync()) and released when the call returns.
selscan_status_t run_with_tensors(const std::vector<Tensor*>& ts, const DeviceMemory* dev,
                                  const std::function<selscan_status_t(const Case::PtrMap&)>& call);
// CPU exec with `threads` workers; CUDA exec on `device` with `stream` (a cudaStream_t; NULL: the legacy stream).
selscan_exec_t cpu_exec(int threads = 0);
selscan_exec_t cuda_exec(void* stream = nullptr, int32_t device = 0);

// The stored inputs the oracle reads, as the time-major tensors of a dense or a packed (varlen) call hold them.
struct RefInputs {
  const Tensor &u, &delta, &z, &A, &B, &C, &D, &delta_bias;
  bool var_B, var_C, complex, bc_3d, softplus, has_D, has_z, has_delta_bias;
  int64_t groups;
};
// A RefProblem of p_rows rows and p_len steps (given in p.Bt, p.L, with p.D, p.N) reading rows [row0, row0 + p.Bt)
// and times [t0, t0 + p.L) of the time-major inputs: every input but h0 (which the caller sets).
void fill_ref_inputs(RefProblem& p, const RefInputs& in, int64_t row0, int64_t t0);
// Rows [row0, ...) and times [t0, t0 + p.L) of a (rows, D, L) tensor, as RefProblem::bdl lays them out.
std::vector<double> ref_rows(const RefProblem& p, const Tensor& t, int64_t row0, int64_t t0);

// The oracle's view of the stored (rounded) inputs, and the oracle's dout.
RefProblem ref_problem(const Case& c);
std::vector<double> ref_dout(const Case& c);
// Chunk states as the x tensor lays them out: [..., 2n] = P, [..., 2n+1] = H, flattened like values().
std::vector<double> ref_x_values(const RefFwd& f, const Case& c);
// Their condition scales (RefFwd::cond_xP, cond_xH; ref_forward(p, true)) in the same layout.
std::vector<double> ref_x_cond(const RefFwd& f, const Case& c);

}  // namespace selscan_test
