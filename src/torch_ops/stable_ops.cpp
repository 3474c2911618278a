// The op library selscan_torch_ops, built against PyTorch's stable ABI (torch/csrc/stable, PyTorch >= 2.9): each op
// reads its tensors' layouts through torch's C shim and calls one C ABI entry point, so an eager call from Python
// pays torch's dispatcher and this file, not the binding's per-call Python work.
//   selscan::state_update   the decode step (selscan_state_update; bench/bench_decode_host.py, row `stable`)
//   selscan::scan_fwd       the scan's forward (selscan_fwd) with its outputs and workspace allocated here
//                           (bench/python_host.py)
//   selscan::scan_fwd_for_grad  the same for a training forward, also returning the inputs as converted
//   selscan::scan_bwd       the scan's backward (selscan_bwd) with its gradients and workspace allocated here
//
// The library links neither libtorch nor libpython: every torch symbol resolves from the torch already loaded in
// the process when torch.ops.load_library opens it, and the registrations run from static initialisers, so the
// library exports nothing. The semantics are the binding's (python/selscan/_decode.py, python/selscan/torch.py):
// arguments in a dtype the library does not read are converted as the binding converts them, tensors written in
// place never are; a failing call raises with selscan_last_error()'s text, which names the argument.
#include <selscan/selscan.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

// In libtorch_cuda, which a CPU-only torch does not have; declared weak so that the library still loads there
// (and, with no CUDA tensor to dispatch on, its CUDA kernel is never called). shim.h declares it only under
// USE_CUDA.
extern "C" __attribute__((weak, visibility("default"))) AOTITorchError
aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream);

namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

// An argument error, without the op's name: each op catches it and raises a std::runtime_error prefixed with its
// name, which torch turns into a Python RuntimeError with that text (STD_TORCH_CHECK would prefix the source file
// and line).
struct ArgError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& message) { throw ArgError(message); }

[[noreturn]] void rethrow_named(const char* op, const ArgError& e) {
  throw std::runtime_error(std::string(op) + ": " + e.what());
}

void shim(AOTITorchError err, const char* what, const char* name) {
  if (err != AOTI_TORCH_SUCCESS) {
    fail(std::string("torch could not ") + what + " of " + name);
  }
}

// torch's dtype codes are functions of the shim; read once, at load.
struct Codes {
  int32_t f32 = aoti_torch_dtype_float32(), f16 = aoti_torch_dtype_float16(), bf16 = aoti_torch_dtype_bfloat16();
  int32_t f64 = aoti_torch_dtype_float64(), c64 = aoti_torch_dtype_complex64(), c128 = aoti_torch_dtype_complex128();
  int32_t i32 = aoti_torch_dtype_int32(), i64 = aoti_torch_dtype_int64(), u8 = aoti_torch_dtype_uint8();
  int32_t cpu = aoti_torch_device_type_cpu(), cuda = aoti_torch_device_type_cuda();
};
const Codes kCodes;

int32_t dtype_of(AtenTensorHandle h, const char* name) {
  int32_t d = 0;
  shim(aoti_torch_get_dtype(h, &d), "read the dtype", name);
  return d;
}

bool is_io(int32_t d) { return d == kCodes.f32 || d == kCodes.f16 || d == kCodes.bf16; }

// One aten op through the dispatcher, returning its result: the dispatcher hands it back in stack[0] as a new
// owning handle, which the returned Tensor takes (left there, the result's memory would never be freed).
template <size_t N>
Tensor dispatch(const char* op, const char* overload, std::array<StableIValue, N>& stack, const char* what,
                const char* name) {
  shim(aoti_torch_call_dispatcher(op, overload, stack.data()), what, name);
  return torch::stable::detail::to<Tensor>(stack[0]);
}

// A copy in dtype `to` (aten::to.dtype through the dispatcher: the only conversion the 2.9 stable ABI has).
Tensor converted(const Tensor& t, ScalarType to) {
  std::array<StableIValue, 5> stack{torch::stable::detail::from(t), torch::stable::detail::from(to),
                                    torch::stable::detail::from(false), torch::stable::detail::from(false),
                                    torch::stable::detail::from(std::nullopt)};
  return dispatch("aten::to", "dtype", stack, "convert the dtype", "a tensor");
}

struct Device {
  int32_t type, index;
};

Device device_of(AtenTensorHandle h, const char* name) {
  Device d{};
  shim(aoti_torch_get_device_type(h, &d.type), "read the device", name);
  shim(aoti_torch_get_device_index(h, &d.index), "read the device", name);
  return d;
}

std::string device_name(Device d) {
  if (d.type == kCodes.cpu) {
    return "cpu";
  }
  return (d.type == kCodes.cuda ? "cuda:" : "device type " + std::to_string(d.type) + ":") + std::to_string(d.index);
}

// `ref` names the argument whose device the call runs on (x for the decode step, u for the scan).
void same_device(AtenTensorHandle h, const char* name, Device ref_dev, const char* ref = "x") {
  const Device d = device_of(h, name);
  if (d.type != ref_dev.type || d.index != ref_dev.index) {
    fail(std::string(name) + " is on " + device_name(d) + " but " + ref + " is on " + device_name(ref_dev));
  }
}

// The descriptor of one tensor; the library checks the shape, the strides and the dtype against the problem.
void describe(selscan_tensor_t& out, AtenTensorHandle h, int32_t dtype, const char* name) {
  int64_t ndim = 0;
  int64_t *sizes = nullptr, *strides = nullptr;
  shim(aoti_torch_get_dim(h, &ndim), "read the shape", name);
  if (ndim > SELSCAN_MAX_NDIM) {
    fail(std::string(name) + " has " + std::to_string(ndim) + " dims, at most " +
         std::to_string(SELSCAN_MAX_NDIM) + " expected");
  }
  shim(aoti_torch_get_sizes(h, &sizes), "read the shape", name);
  shim(aoti_torch_get_strides(h, &strides), "read the strides", name);
  shim(aoti_torch_get_data_ptr(h, &out.data), "read the data pointer", name);
  out.ndim = static_cast<int32_t>(ndim);
  for (int64_t i = 0; i < ndim; ++i) {
    out.sizes[i] = sizes[i];
    out.strides[i] = strides[i];
  }
  if (dtype == kCodes.f32) {
    out.dtype = SELSCAN_DTYPE_FLOAT32;
  } else if (dtype == kCodes.bf16) {
    out.dtype = SELSCAN_DTYPE_BFLOAT16;
  } else if (dtype == kCodes.f16) {
    out.dtype = SELSCAN_DTYPE_FLOAT16;
  } else if (dtype == kCodes.c64) {
    out.dtype = SELSCAN_DTYPE_COMPLEX64;
  } else if (dtype == kCodes.i32) {
    out.dtype = SELSCAN_DTYPE_INT32;
  } else if (dtype == kCodes.i64) {
    out.dtype = SELSCAN_DTYPE_INT64;
  } else {
    out.dtype = -1;  // not reached after the conversions; the library would name the argument
  }
}

// An input as the library reads it: the caller's tensor, or a copy in dtype `to` (kept alive in `keep`) when
// want(its dtype) is false.
template <class Want>
void argument(selscan_tensor_t& slot, const Tensor& t, const char* name, Device x_dev, Want want, ScalarType to,
              std::optional<Tensor>& keep) {
  same_device(t.get(), name, x_dev);
  const int32_t d = dtype_of(t.get(), name);
  if (want(d)) {
    describe(slot, t.get(), d, name);
    return;
  }
  keep = converted(t, to);
  describe(slot, keep->get(), dtype_of(keep->get(), name), name);
}

ScalarType scalar_type_of(int32_t d) {
  if (d == kCodes.bf16) {
    return ScalarType::BFloat16;
  }
  return d == kCodes.f16 ? ScalarType::Half : ScalarType::Float;
}

const char* dtype_name(int32_t d) {
  if (d == kCodes.f32) return "float32";
  if (d == kCodes.f16) return "float16";
  if (d == kCodes.bf16) return "bfloat16";
  if (d == kCodes.i32) return "int32";
  if (d == kCodes.i64) return "int64";
  return "another dtype";
}

// The exec struct of a call on the device of argument `name`: CUDA calls run on torch's current stream of it.
template <bool kCuda>
selscan_exec_t exec_for(Device dev, const char* name) {
  selscan_exec_t exec{sizeof(selscan_exec_t), SELSCAN_DEVICE_CPU, 0, nullptr, nullptr, 0, 0, 0};
  if constexpr (kCuda) {
    exec.device_kind = SELSCAN_DEVICE_CUDA;
    exec.device_index = dev.index;
    if (aoti_torch_get_current_cuda_stream == nullptr) {
      fail(std::string("this torch has no CUDA stream API (aoti_torch_get_current_cuda_stream) but ") + name +
           " is on " + device_name(dev));
    }
    shim(aoti_torch_get_current_cuda_stream(dev.index, &exec.stream), "read the current CUDA stream",
         (std::string(name) + "'s device").c_str());
  }
  return exec;
}

void library_call(selscan_status_t status) {
  if (status != SELSCAN_STATUS_SUCCESS) {
    const char* detail = selscan_last_error();
    fail(std::string(selscan_status_string(status)) + ": " + (detail && *detail ? detail : "(no message)"));
  }
}

// A new row-major tensor, with torch's contiguous strides (a dimension of size 0 counts as 1 in them).
Tensor new_rows(int32_t ndim, const int64_t* sizes, int32_t dtype, Device dev, const char* name) {
  std::array<int64_t, SELSCAN_MAX_NDIM> strides{};
  int64_t step = 1;
  for (int32_t i = ndim - 1; i >= 0; --i) {
    strides[i] = step;
    step *= sizes[i] > 1 ? sizes[i] : 1;
  }
  AtenTensorHandle h = nullptr;
  shim(aoti_torch_empty_strided(ndim, sizes, strides.data(), dtype, dev.type, dev.index, &h), "allocate", name);
  return Tensor(h);
}

template <bool kCuda>
Tensor state_update_checked(const Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A,
                            const Tensor& B, const Tensor& C, const std::optional<Tensor>& D,
                            const std::optional<Tensor>& z, const std::optional<Tensor>& dt_bias, bool dt_softplus,
                            const std::optional<Tensor>& state_batch_indices, int64_t pad_slot_id,
                            const std::optional<Tensor>& dst_state_batch_indices,
                            const std::optional<Tensor>& out) {
  selscan_state_update_args_t args = SELSCAN_STATE_UPDATE_ARGS_INIT;
  args.pad_slot_id = pad_slot_id;
  args.dt_softplus = dt_softplus ? 1 : 0;
  const Device x_dev = device_of(x.get(), "x");

  // Copies the library reads instead of the caller's tensors, alive until the call returns.
  std::array<std::optional<Tensor>, 10> keep;
  int32_t xd = dtype_of(x.get(), "x");
  argument(args.x, x, "x", x_dev, is_io, ScalarType::Float, keep[0]);
  xd = is_io(xd) ? xd : kCodes.f32;
  const ScalarType x_type = scalar_type_of(xd);
  auto f32_or_x = [xd](int32_t d) { return d == kCodes.f32 || d == xd; };
  auto f32 = [](int32_t d) { return d == kCodes.f32; };
  auto index = [](int32_t d) { return d == kCodes.i32 || d == kCodes.i64; };
  argument(args.dt, dt, "dt", x_dev, f32_or_x, x_type, keep[1]);
  argument(args.A, A, "A", x_dev, f32, ScalarType::Float, keep[2]);
  argument(args.B, B, "B", x_dev, f32_or_x, x_type, keep[3]);
  argument(args.C, C, "C", x_dev, f32_or_x, x_type, keep[4]);
  if (D) argument(args.D, *D, "D", x_dev, f32, ScalarType::Float, keep[5]);
  if (z) argument(args.z, *z, "z", x_dev, f32_or_x, x_type, keep[6]);
  if (dt_bias) argument(args.dt_bias, *dt_bias, "dt_bias", x_dev, f32, ScalarType::Float, keep[7]);
  if (state_batch_indices) {
    argument(args.state_batch_indices, *state_batch_indices, "state_batch_indices", x_dev, index, ScalarType::Long,
             keep[8]);
  }
  if (dst_state_batch_indices) {
    argument(args.dst_state_batch_indices, *dst_state_batch_indices, "dst_state_batch_indices", x_dev, index,
             ScalarType::Long, keep[9]);
  }
  // The outputs are written in place, so never converted.
  const int32_t sd = dtype_of(state.get(), "state");
  if (sd != kCodes.f32 && sd != xd) {
    fail(std::string("state: dtype ") + dtype_name(sd) + " cannot be used: the state is updated in place, so it "
         "must be float32 or x's dtype (" + dtype_name(xd) + ")");
  }
  same_device(state.get(), "state", x_dev);
  describe(args.state, state.get(), sd, "state");
  std::optional<Tensor> result = out;
  if (out) {
    const int32_t od = dtype_of(out->get(), "out");
    if (od != xd) {
      fail(std::string("out: dtype ") + dtype_name(od) + " cannot be used: the library writes out in x's dtype (" +
           dtype_name(xd) + ")");
    }
    same_device(out->get(), "out", x_dev);
    describe(args.out, out->get(), od, "out");
  } else {
    // Row-major, x's sizes: the binding's empty_like(x, memory_format=contiguous_format).
    result.emplace(new_rows(args.x.ndim, args.x.sizes, xd, x_dev, "out"));
    describe(args.out, result->get(), xd, "out");
  }

  selscan_exec_t exec = exec_for<kCuda>(x_dev, "x");
  library_call(selscan_state_update(&args, &exec));
  return *result;
}

template <bool kCuda>
Tensor state_update(const Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
                    const Tensor& C, const std::optional<Tensor>& D, const std::optional<Tensor>& z,
                    const std::optional<Tensor>& dt_bias, bool dt_softplus,
                    const std::optional<Tensor>& state_batch_indices, int64_t pad_slot_id,
                    const std::optional<Tensor>& dst_state_batch_indices, const std::optional<Tensor>& out) {
  try {
    return state_update_checked<kCuda>(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                                       pad_slot_id, dst_state_batch_indices, out);
  } catch (const ArgError& e) {
    rethrow_named("selscan::state_update", e);
  }
}

// ------------------------------------------------------------------------------------------------ scan forward
// selscan::scan_fwd converts its arguments as selscan.torch's forward does (TorchBackend.cast, then
// fix_layout): each to the dtype the library reads (u's for delta, z and variable B/C, A's for constant B/C,
// float32 or complex64 for A, float32 for D and delta_bias), then each (..., L) tensor whose last dimension is
// strided to a row-major copy. The copies hold the same values, so the library call and its outputs are the ones
// the binding's call makes.

bool is_float(int32_t d) { return is_io(d) || d == kCodes.f64; }
bool is_complex(int32_t d) { return d == kCodes.c64 || d == kCodes.c128; }

ScalarType scalar_type_to(int32_t d) { return d == kCodes.c64 ? ScalarType::ComplexFloat : scalar_type_of(d); }

std::string dtype_label(int32_t d) {
  if (d == kCodes.f64) return "float64";
  if (d == kCodes.c64) return "complex64";
  if (d == kCodes.c128) return "complex128";
  return dtype_name(d);
}

// A row-major copy (Tensor.contiguous()'s values) of t when its last dimension is strided, else nullopt.
std::optional<Tensor> row_copy(const Tensor& t, int32_t dtype, Device dev, const char* name) {
  AtenTensorHandle h = t.get();
  int64_t ndim = 0;
  int64_t *sizes = nullptr, *strides = nullptr;
  shim(aoti_torch_get_dim(h, &ndim), "read the shape", name);
  if (ndim < 1 || ndim > SELSCAN_MAX_NDIM) {
    return std::nullopt;  // nothing to fix; describe() names a rank above SELSCAN_MAX_NDIM, the library a wrong one
  }
  shim(aoti_torch_get_sizes(h, &sizes), "read the shape", name);
  shim(aoti_torch_get_strides(h, &strides), "read the strides", name);
  if (sizes[ndim - 1] <= 1 || strides[ndim - 1] == 1) {
    return std::nullopt;
  }
  Tensor copy = new_rows(static_cast<int32_t>(ndim), sizes, dtype, dev, name);
  std::array<StableIValue, 3> stack{torch::stable::detail::from(copy), torch::stable::detail::from(t),
                                    torch::stable::detail::from(false)};
  return dispatch("aten::copy_", "", stack, "copy", name);  // copy_'s result: copy itself
}

// One input of the scan, in dtype `to` and, when `rows`, with a unit last stride: the caller's tensor where it is
// already so, else a copy kept alive in `keep` until the call returns.
void scan_input(selscan_tensor_t& slot, const Tensor& t, const char* name, Device dev, int32_t to, bool rows,
                std::optional<Tensor>& keep) {
  same_device(t.get(), name, dev, "u");
  const Tensor* cur = &t;  // the caller's tensor, or the copy in `keep`
  const int32_t d = dtype_of(t.get(), name);
  if (d != to) {
    if (!is_float(d) && !is_complex(d)) {
      fail(std::string(name) + ": dtype " + dtype_label(d) + " cannot be used: expected a floating-point tensor");
    }
    if (is_complex(d) && to != kCodes.c64) {
      fail(std::string(name) + ": dtype " + dtype_label(d) + " cannot be used: expected a real tensor" +
           (name[0] == 'B' || name[0] == 'C' ? " (A is real)" : ""));
    }
    keep = converted(t, scalar_type_to(to));
    cur = &*keep;
  }
  if (rows) {
    if (std::optional<Tensor> c = row_copy(*cur, to, dev, name)) {
      keep = std::move(c);
      cur = &*keep;
    }
  }
  describe(slot, cur->get(), to, name);
}

int64_t dim_of(AtenTensorHandle h, const char* name) {
  int64_t ndim = 0;
  shim(aoti_torch_get_dim(h, &ndim), "read the shape", name);
  return ndim;
}

// The workspace a CUDA call asks for depends on its shapes, strides, dtypes, flags and device, not on its
// addresses: the last few answers of this thread are kept under the argument struct with every present tensor's
// address replaced by 1 (the library still checks each call's workspace against its need). Args: the forward's or
// the backward's argument struct.
template <class Args>
struct WorkspaceMemo {
  static constexpr int kEntries = 4;
  struct Entry {
    bool valid = false;
    int32_t device = 0;
    Args key{};
    size_t bytes = 0;
  };
  std::array<Entry, kEntries> entries{};
  int next = 0;
};

selscan_fwd_args_t address_free(const selscan_fwd_args_t& args) {
  selscan_fwd_args_t key;
  std::memcpy(&key, &args, sizeof key);  // args was zeroed whole (padding included) before it was filled
  for (selscan_tensor_t* t : {&key.u, &key.delta, &key.A, &key.B, &key.C, &key.D, &key.z, &key.delta_bias, &key.h0,
                              &key.out, &key.out_z, &key.x, &key.last_state, &key.cu_seqlens, &key.ssm_states,
                              &key.cache_indices, &key.has_initial_state, &key.block_table, &key.context_lens}) {
    t->data = t->data != nullptr ? reinterpret_cast<void*>(1) : nullptr;
  }
  return key;
}

selscan_bwd_args_t address_free(const selscan_bwd_args_t& args) {
  selscan_bwd_args_t key;
  std::memcpy(&key, &args, sizeof key);
  for (selscan_tensor_t* t : {&key.u, &key.delta, &key.A, &key.B, &key.C, &key.D, &key.z, &key.delta_bias, &key.h0,
                              &key.dout, &key.x, &key.out, &key.du, &key.ddelta, &key.dA, &key.dB, &key.dC, &key.dD,
                              &key.dz, &key.ddelta_bias, &key.dh0, &key.out_z, &key.cu_seqlens, &key.cache_indices,
                              &key.has_initial_state}) {
    t->data = t->data != nullptr ? reinterpret_cast<void*>(1) : nullptr;
  }
  return key;
}

selscan_status_t workspace_size(const selscan_fwd_args_t& a, const selscan_exec_t& e, size_t* bytes) {
  return selscan_fwd_workspace_size(&a, &e, bytes);
}
selscan_status_t workspace_size(const selscan_bwd_args_t& a, const selscan_exec_t& e, size_t* bytes) {
  return selscan_bwd_workspace_size(&a, &e, bytes);
}

template <class Args>
size_t workspace_bytes(const Args& args, const selscan_exec_t& exec) {
  thread_local WorkspaceMemo<Args> memo;
  const Args key = address_free(args);
  for (const auto& e : memo.entries) {
    if (e.valid && e.device == exec.device_index && std::memcmp(&e.key, &key, sizeof key) == 0) {
      return e.bytes;
    }
  }
  size_t bytes = 0;
  library_call(workspace_size(args, exec, &bytes));
  auto& e = memo.entries[memo.next];
  memo.next = (memo.next + 1) % WorkspaceMemo<Args>::kEntries;
  e.valid = true;
  e.device = exec.device_index;
  std::memcpy(&e.key, &key, sizeof key);
  e.bytes = bytes;
  return bytes;
}

// A CUDA call's workspace as a new byte tensor (freed to torch's caching allocator after the call is enqueued on
// its stream), set in exec; nothing where the call needs none.
template <class Args>
std::optional<Tensor> workspace_for(const Args& args, selscan_exec_t& exec, Device dev) {
  const size_t bytes = workspace_bytes(args, exec);
  if (bytes == 0) {
    return std::nullopt;
  }
  const int64_t size = static_cast<int64_t>(bytes);
  Tensor ws = new_rows(1, &size, kCodes.u8, dev, "the workspace");
  shim(aoti_torch_get_data_ptr(ws.get(), &exec.workspace), "read the data pointer", "the workspace");
  exec.workspace_bytes = bytes;
  return ws;
}

// The call's device (u's), u's dtype (the library's itype) and the weights' (A's: float32 or complex64).
struct ScanTypes {
  Device dev;
  int32_t it, wt;
};

ScanTypes scan_types(const Tensor& u, const Tensor& A) {
  const int32_t it = dtype_of(u.get(), "u");
  if (!is_io(it)) {
    fail("u: dtype " + dtype_label(it) + " is not supported (expected float32, float16 or bfloat16)");
  }
  const int64_t u_dim = dim_of(u.get(), "u"), a_dim = dim_of(A.get(), "A");
  if (u_dim != 3) {
    fail("u: has " + std::to_string(u_dim) + " dims, expected 3 (batch, dim, seqlen)");
  }
  if (a_dim != 2) {
    fail("A: has " + std::to_string(a_dim) + " dims, expected 2 (dim, dstate)");
  }
  return {device_of(u.get(), "u"), it, is_complex(dtype_of(A.get(), "A")) ? kCodes.c64 : kCodes.f32};
}

// The eight inputs into either direction's argument struct, converted into keep[0..7] where the library reads
// another dtype or layout; returns the dtypes B and C are read in (u's where variable, A's where constant), which
// their gradients take too.
template <class Args, size_t K>
std::array<int32_t, 2> scan_inputs(Args& args, const ScanTypes& ty, const Tensor& u, const Tensor& delta,
                                   const Tensor& A, const Tensor& B, const Tensor& C, const std::optional<Tensor>& D,
                                   const std::optional<Tensor>& z, const std::optional<Tensor>& delta_bias,
                                   std::array<std::optional<Tensor>, K>& keep) {
  static_assert(K >= 8, "a slot per input");
  const Device dev = ty.dev;
  scan_input(args.u, u, "u", dev, ty.it, true, keep[0]);
  scan_input(args.delta, delta, "delta", dev, ty.it, true, keep[1]);
  scan_input(args.A, A, "A", dev, ty.wt, false, keep[2]);
  std::array<int32_t, 2> bc_type{ty.wt, ty.wt};
  for (auto [slot, t, name, k] : {std::make_tuple(&args.B, &B, "B", 3), std::make_tuple(&args.C, &C, "C", 4)}) {
    const bool variable = dim_of(t->get(), name) >= 3;
    if (variable && is_complex(dtype_of(t->get(), name))) {
      fail(std::string(name) + ": a variable " + name + " must be real here: pass it Re/Im interleaved along the "
           "last dimension (..., 2L), or through selscan.torch.selective_scan_fn, which interleaves it");
    }
    bc_type[k - 3] = variable ? ty.it : ty.wt;
    scan_input(*slot, *t, name, dev, bc_type[k - 3], variable, keep[k]);
  }
  if (D) scan_input(args.D, *D, "D", dev, kCodes.f32, false, keep[5]);
  if (z) scan_input(args.z, *z, "z", dev, ty.it, true, keep[6]);
  if (delta_bias) scan_input(args.delta_bias, *delta_bias, "delta_bias", dev, kCodes.f32, false, keep[7]);
  return bc_type;
}

using ScanOutputs = std::tuple<Tensor, std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>>;
// The eight inputs (u, delta, A, B, C, D, z, delta_bias) as the call converted them, nullopt where it read the
// caller's tensor as it is.
using ScanCopies = std::array<std::optional<Tensor>, 8>;

template <bool kCuda>
ScanOutputs scan_fwd_checked(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                             const std::optional<Tensor>& D, const std::optional<Tensor>& z,
                             const std::optional<Tensor>& delta_bias, bool delta_softplus, bool want_x,
                             bool want_last, const std::optional<Tensor>& out_z, ScanCopies& keep) {
  selscan_fwd_args_t args;
  std::memset(&args, 0, sizeof args);  // padding too: the workspace memo compares the struct bytewise
  args.struct_size = sizeof args;
  args.delta_softplus = delta_softplus ? 1 : 0;
  const ScanTypes ty = scan_types(u, A);
  const Device dev = ty.dev;
  const int32_t it = ty.it, wt = ty.wt;
  scan_inputs(args, ty, u, delta, A, B, C, D, z, delta_bias, keep);

  // The outputs: new row-major tensors (the binding's new_empty), out_z the caller's where given.
  const int64_t bt = args.u.sizes[0], dm = args.u.sizes[1], L = args.u.sizes[2], n = args.A.sizes[1];
  Tensor out = new_rows(3, args.u.sizes, it, dev, "out");
  describe(args.out, out.get(), it, "out");
  std::optional<Tensor> oz, x, last;
  if (out_z) {
    if (!z) {
      fail("out_z: given without z (out_z is out * silu(z))");
    }
    const int32_t od = dtype_of(out_z->get(), "out_z");
    if (od != it) {
      fail("out_z: dtype " + dtype_label(od) + " cannot be used: the library writes out_z in u's dtype (" +
           dtype_label(it) + ")");
    }
    same_device(out_z->get(), "out_z", dev, "u");
    oz = out_z;
  } else if (z) {
    oz = new_rows(3, args.u.sizes, it, dev, "out_z");
  }
  if (oz) describe(args.out_z, oz->get(), it, "out_z");
  if (want_x) {
    const int64_t sizes[4] = {bt, dm, (L + SELSCAN_CHUNK - 1) / SELSCAN_CHUNK, 2 * n};
    x = new_rows(4, sizes, wt, dev, "x");
    describe(args.x, x->get(), wt, "x");
  }
  if (want_last) {
    const int64_t sizes[3] = {bt, dm, n};
    last = new_rows(3, sizes, wt, dev, "last_state");
    describe(args.last_state, last->get(), wt, "last_state");
  }

  selscan_exec_t exec = exec_for<kCuda>(dev, "u");
  std::optional<Tensor> workspace;
  if constexpr (kCuda) workspace = workspace_for(args, exec, dev);
  library_call(selscan_fwd(&args, &exec));
  return {out, oz, x, last};
}

template <bool kCuda>
ScanOutputs scan_fwd(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B, const Tensor& C,
                     const std::optional<Tensor>& D, const std::optional<Tensor>& z,
                     const std::optional<Tensor>& delta_bias, bool delta_softplus, bool want_x, bool want_last,
                     const std::optional<Tensor>& out_z) {
  try {
    ScanCopies copies;  // alive until the call is enqueued; torch's allocator keeps their memory for the stream
    return scan_fwd_checked<kCuda>(u, delta, A, B, C, D, z, delta_bias, delta_softplus, want_x, want_last, out_z,
                                   copies);
  } catch (const ArgError& e) {
    rethrow_named("selscan::scan_fwd", e);
  }
}

// A training forward: scan_fwd's outputs, then the inputs as the library read them (the converted copies, None
// where the caller's tensor was read as it is), which the backward needs and the caller saves for it. One op call
// instead of a Python plan lookup that would find the same conversions.
using ScanTrainOutputs =
    std::tuple<Tensor, std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
               std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
               std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>>;

template <bool kCuda>
ScanTrainOutputs scan_fwd_for_grad(const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                                   const Tensor& C, const std::optional<Tensor>& D, const std::optional<Tensor>& z,
                                   const std::optional<Tensor>& delta_bias, bool delta_softplus, bool want_x,
                                   bool want_last) {
  try {
    ScanCopies c;
    auto [out, oz, x, last] = scan_fwd_checked<kCuda>(u, delta, A, B, C, D, z, delta_bias, delta_softplus, want_x,
                                                      want_last, std::nullopt, c);
    return {out, oz, x, last, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]};
  } catch (const ArgError& e) {
    rethrow_named("selscan::scan_fwd_for_grad", e);
  }
}

// ------------------------------------------------------------------------------------------------ scan backward
// selscan::scan_bwd: the backward of a training forward, given its saved tensors (u ... delta_bias as the forward
// read them, its x and out) and the gradient of its output. Each argument is converted as scan_fwd converts it
// (none is, when they come from scan_fwd_for_grad); dout to u's dtype and a unit last stride, as the binding's
// backward plan does. The gradients are new row-major tensors, as the binding allocates them: du, ddelta and dz in
// u's dtype, dA in A's, dB / dC in u's where variable and A's where constant, dD and ddelta_bias float32.
using ScanGrads = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, std::optional<Tensor>, std::optional<Tensor>,
                             std::optional<Tensor>>;

template <bool kCuda>
ScanGrads scan_bwd_checked(const Tensor& dout, const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                           const Tensor& C, const std::optional<Tensor>& D, const std::optional<Tensor>& z,
                           const std::optional<Tensor>& delta_bias, const std::optional<Tensor>& x,
                           const std::optional<Tensor>& out, bool delta_softplus, bool deterministic) {
  selscan_bwd_args_t args;
  std::memset(&args, 0, sizeof args);  // padding too: the workspace memo compares the struct bytewise
  args.struct_size = sizeof args;
  args.delta_softplus = delta_softplus ? 1 : 0;
  args.deterministic = deterministic ? 1 : 0;
  const ScanTypes ty = scan_types(u, A);
  const Device dev = ty.dev;
  const int32_t it = ty.it, wt = ty.wt;
  std::array<std::optional<Tensor>, 11> keep;  // converted copies, alive until the call is enqueued
  const std::array<int32_t, 2> bc_type = scan_inputs(args, ty, u, delta, A, B, C, D, z, delta_bias, keep);
  scan_input(args.dout, dout, "dout", dev, it, true, keep[8]);
  if (x) scan_input(args.x, *x, "x", dev, wt, false, keep[9]);
  if (out) scan_input(args.out, *out, "out", dev, it, true, keep[10]);

  const auto grad = [&](selscan_tensor_t& slot, const selscan_tensor_t& like, int32_t dtype, const char* name) {
    Tensor g = new_rows(like.ndim, like.sizes, dtype, dev, name);
    describe(slot, g.get(), dtype, name);
    return g;
  };
  Tensor du = grad(args.du, args.u, it, "du");
  Tensor ddelta = grad(args.ddelta, args.u, it, "ddelta");
  Tensor dA = grad(args.dA, args.A, wt, "dA");
  Tensor dB = grad(args.dB, args.B, bc_type[0], "dB");
  Tensor dC = grad(args.dC, args.C, bc_type[1], "dC");
  std::optional<Tensor> dD, dz, dbias;
  if (D) dD = grad(args.dD, args.D, kCodes.f32, "dD");
  if (z) dz = grad(args.dz, args.u, it, "dz");
  if (delta_bias) dbias = grad(args.ddelta_bias, args.delta_bias, kCodes.f32, "ddelta_bias");

  selscan_exec_t exec = exec_for<kCuda>(dev, "u");
  std::optional<Tensor> workspace;
  if constexpr (kCuda) workspace = workspace_for(args, exec, dev);
  library_call(selscan_bwd(&args, &exec));
  return {du, ddelta, dA, dB, dC, dD, dz, dbias};
}

template <bool kCuda>
ScanGrads scan_bwd(const Tensor& dout, const Tensor& u, const Tensor& delta, const Tensor& A, const Tensor& B,
                   const Tensor& C, const std::optional<Tensor>& D, const std::optional<Tensor>& z,
                   const std::optional<Tensor>& delta_bias, const std::optional<Tensor>& x,
                   const std::optional<Tensor>& out, bool delta_softplus, bool deterministic) {
  try {
    return scan_bwd_checked<kCuda>(dout, u, delta, A, B, C, D, z, delta_bias, x, out, delta_softplus, deterministic);
  } catch (const ArgError& e) {
    rethrow_named("selscan::scan_bwd", e);
  }
}

}  // namespace

// Tensor(b!)? out: written in place when given, and returned (an alias of it), as selscan.torch's `out=`.
STABLE_TORCH_LIBRARY_FRAGMENT(selscan, m) {
  m.def("state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D=None, "
        "Tensor? z=None, Tensor? dt_bias=None, bool dt_softplus=False, Tensor? state_batch_indices=None, "
        "int pad_slot_id=-1, Tensor? dst_state_batch_indices=None, Tensor(b!)? out=None) -> Tensor");
  // (out, out_z, x, last_state): out_z absent without z, x without want_x, last_state without want_last. out_z
  // given: written in place and returned (an alias of it), as selscan.torch's fused layer passes it.
  m.def("scan_fwd(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D=None, Tensor? z=None, "
        "Tensor? delta_bias=None, bool delta_softplus=False, bool want_x=False, bool want_last=False, "
        "Tensor(a!)? out_z=None) -> (Tensor, Tensor?, Tensor?, Tensor?)");
  // scan_fwd's four outputs, then u, delta, A, B, C, D, z, delta_bias as the library read them: a new tensor
  // where the call converted one (dtype or a strided last dimension), None where it read the argument as given.
  m.def("scan_fwd_for_grad(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D=None, Tensor? z=None, "
        "Tensor? delta_bias=None, bool delta_softplus=False, bool want_x=False, bool want_last=False) -> (Tensor, "
        "Tensor?, Tensor?, Tensor?, Tensor?, Tensor?, Tensor?, Tensor?, Tensor?, Tensor?, Tensor?, Tensor?)");
  // (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias): dD, dz, ddelta_bias absent where D, z, delta_bias are. x: the
  // forward's chunk states (required when seqlen > 2048), out: its pre-gate output (required with z).
  m.def("scan_bwd(Tensor dout, Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D=None, "
        "Tensor? z=None, Tensor? delta_bias=None, Tensor? x=None, Tensor? out=None, bool delta_softplus=False, "
        "bool deterministic=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor?, Tensor?, Tensor?)");
}

STABLE_TORCH_LIBRARY_IMPL(selscan, CPU, m) {
  m.impl("state_update", TORCH_BOX(&state_update<false>));
  m.impl("scan_fwd", TORCH_BOX(&scan_fwd<false>));
  m.impl("scan_fwd_for_grad", TORCH_BOX(&scan_fwd_for_grad<false>));
  m.impl("scan_bwd", TORCH_BOX(&scan_bwd<false>));
}

STABLE_TORCH_LIBRARY_IMPL(selscan, CUDA, m) {
  m.impl("state_update", TORCH_BOX(&state_update<true>));
  m.impl("scan_fwd", TORCH_BOX(&scan_fwd<true>));
  m.impl("scan_fwd_for_grad", TORCH_BOX(&scan_fwd_for_grad<true>));
  m.impl("scan_bwd", TORCH_BOX(&scan_bwd<true>));
}
