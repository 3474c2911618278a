// selscan::state_update, the decode step as a torch op built against PyTorch's stable ABI
// (torch/csrc/stable, PyTorch >= 2.9): the library reads each tensor's layout through torch's C shim and calls
// selscan_state_update, so an eager call from Python pays torch's dispatcher and this file, not the binding's
// per-tensor Python checks (bench/bench_decode_host.py, row `stable`).
//
// The library links neither libtorch nor libpython: every torch symbol resolves from the torch already loaded in
// the process when torch.ops.load_library opens it, and the registrations run from static initialisers, so the
// library exports nothing. The semantics are selscan.selective_state_update's (python/selscan/_decode.py):
// arguments in a dtype the library does not read are converted as the binding converts them, the state and a
// given out never are; a failing call raises with selscan_last_error()'s text, which names the argument.
#include <selscan/selscan.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <array>
#include <cstdint>
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

// torch turns a std::runtime_error into a Python RuntimeError with this text (STD_TORCH_CHECK would prefix the
// source file and line).
[[noreturn]] void fail(const std::string& message) {
  throw std::runtime_error("selscan::state_update: " + message);
}

void shim(AOTITorchError err, const char* what, const char* name) {
  if (err != AOTI_TORCH_SUCCESS) {
    fail(std::string("torch could not ") + what + " of " + name);
  }
}

// torch's dtype codes are functions of the shim; read once, at load.
struct Codes {
  int32_t f32 = aoti_torch_dtype_float32(), f16 = aoti_torch_dtype_float16(), bf16 = aoti_torch_dtype_bfloat16();
  int32_t i32 = aoti_torch_dtype_int32(), i64 = aoti_torch_dtype_int64();
  int32_t cpu = aoti_torch_device_type_cpu(), cuda = aoti_torch_device_type_cuda();
};
const Codes kCodes;

int32_t dtype_of(AtenTensorHandle h, const char* name) {
  int32_t d = 0;
  shim(aoti_torch_get_dtype(h, &d), "read the dtype", name);
  return d;
}

bool is_io(int32_t d) { return d == kCodes.f32 || d == kCodes.f16 || d == kCodes.bf16; }

// A copy in dtype `to` (aten::to.dtype through the dispatcher: the only conversion the 2.9 stable ABI has).
Tensor converted(const Tensor& t, ScalarType to) {
  std::array<StableIValue, 5> stack{torch::stable::detail::from(t), torch::stable::detail::from(to),
                                    torch::stable::detail::from(false), torch::stable::detail::from(false),
                                    torch::stable::detail::from(std::nullopt)};
  shim(aoti_torch_call_dispatcher("aten::to", "dtype", stack.data()), "convert the dtype", "a tensor");
  return torch::stable::detail::to<Tensor>(stack[0]);
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

void same_device(AtenTensorHandle h, const char* name, Device x_dev) {
  const Device d = device_of(h, name);
  if (d.type != x_dev.type || d.index != x_dev.index) {
    fail(std::string(name) + " is on " + device_name(d) + " but x is on " + device_name(x_dev));
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

template <bool kCuda>
Tensor state_update(const Tensor& state, const Tensor& x, const Tensor& dt, const Tensor& A, const Tensor& B,
                    const Tensor& C, const std::optional<Tensor>& D, const std::optional<Tensor>& z,
                    const std::optional<Tensor>& dt_bias, bool dt_softplus,
                    const std::optional<Tensor>& state_batch_indices, int64_t pad_slot_id,
                    const std::optional<Tensor>& dst_state_batch_indices, const std::optional<Tensor>& out) {
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
    std::array<int64_t, SELSCAN_MAX_NDIM> strides{};
    int64_t step = 1;
    for (int32_t i = args.x.ndim - 1; i >= 0; --i) {
      strides[i] = step;
      step *= args.x.sizes[i] > 1 ? args.x.sizes[i] : 1;
    }
    AtenTensorHandle h = nullptr;
    shim(aoti_torch_empty_strided(args.x.ndim, args.x.sizes, strides.data(), xd, x_dev.type, x_dev.index, &h),
         "allocate", "out");
    result.emplace(h);
    describe(args.out, h, xd, "out");
  }

  selscan_exec_t exec{sizeof(selscan_exec_t), SELSCAN_DEVICE_CPU, 0, nullptr, nullptr, 0, 0, 0};
  if constexpr (kCuda) {
    exec.device_kind = SELSCAN_DEVICE_CUDA;
    exec.device_index = x_dev.index;
    if (aoti_torch_get_current_cuda_stream == nullptr) {
      fail("this torch has no CUDA stream API (aoti_torch_get_current_cuda_stream) but x is on " +
           device_name(x_dev));
    }
    shim(aoti_torch_get_current_cuda_stream(x_dev.index, &exec.stream), "read the current CUDA stream", "x's device");
  }
  const selscan_status_t status = selscan_state_update(&args, &exec);
  if (status != SELSCAN_STATUS_SUCCESS) {
    const char* detail = selscan_last_error();
    fail(std::string(selscan_status_string(status)) + ": " + (detail && *detail ? detail : "(no message)"));
  }
  return *result;
}

}  // namespace

// Tensor(b!)? out: written in place when given, and returned (an alias of it), as selscan.torch's `out=`.
STABLE_TORCH_LIBRARY_FRAGMENT(selscan, m) {
  m.def("state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D=None, "
        "Tensor? z=None, Tensor? dt_bias=None, bool dt_softplus=False, Tensor? state_batch_indices=None, "
        "int pad_slot_id=-1, Tensor? dst_state_batch_indices=None, Tensor(b!)? out=None) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(selscan, CPU, m) {
  m.impl("state_update", TORCH_BOX(&state_update<false>));
}

STABLE_TORCH_LIBRARY_IMPL(selscan, CUDA, m) {
  m.impl("state_update", TORCH_BOX(&state_update<true>));
}
