"""transformers' Mamba models on libselscan, without changing the model code:

    import selscan.integrations.transformers as sst
    sst.enable()      # MambaForCausalLM / FalconMambaForCausalLM now run their kernels through selscan
    ...
    sst.disable()     # transformers' own functions again

How: transformers >= 5.15 (tested: 5.15, 5.17, 5.23, 5.24) has its mixers call five module-level functions of
transformers.models.mamba.modeling_mamba (and modeling_falcon_mamba), each bound once at import to mamba_ssm's /
causal-conv1d's implementation when those packages import, else to a pure-PyTorch fallback (and, with the `kernels`
package, to a hub kernel): mamba_inner_fn (the fused training path; the fallback returns None, which sends the
mixer to its unfused path), causal_conv1d_fn, causal_conv1d_update, mamba_selective_scan, and
mamba_selective_state_update. The mixer looks those names up in its module's globals at every call, so enable()
rebinds them to adapters that call selscan.torch / selscan, and disable() puts the recorded originals back.
transformers' kernel hub (`kernels`, kernelize / use_kernels=True) is not used: it wants a kernel repository and a
call on each model, and is not installed by default. The mixer has no device gate in 5.x: CPU tensors take the
same (fused) path as CUDA tensors; tensors on any other device go to the original function.

enable() also wraps MambaMixer.forward: a call without a cache, an attention mask or extra arguments (training, and
eval for scoring, evaluation, embeddings) runs the same mamba_inner_fn call as the training branch, with in_proj's
output made as mamba_ssm's Mamba module makes it (a (2*dim, batch*L) GEMM result, so that neither the layer nor
in_proj's backward copies a (batch, 2*dim, L) tensor; eval without a cache then also skips the unfused path's
layout copies). Every other call (a cache, a mask, autocast, an in_proj that is not a plain nn.Linear, e.g. with a
LoRA adapter or a hook) goes to the model's own forward unchanged. Generation's prefill (with a cache) stays on the
unfused path, which must fill the cache's conv and recurrent states.

FalconMamba: its fused call passes all-ones rms weights for B, C and dt. mamba_ssm's mamba_inner_fn normalises
delta over d_inner after dt_proj, while FalconMambaMixer's own forward normalises the time step over its rank
before dt_proj: two different functions (with mamba_ssm installed, transformers trains one and evaluates the
other). To keep the model's one definition, the FalconMamba adapter of mamba_inner_fn declines (returns None) and
the mixer takes its unfused path, whose conv1d and scan are selscan's.
"""

import sys
import threading

import torch
import torch.nn.functional as F

__all__ = ["enable", "disable", "is_enabled", "SUPPORTED", "TESTED_VERSIONS"]

TESTED_VERSIONS = ("5.15.1", "5.17.0", "5.23.0", "5.24.0")

# module -> the mixer class whose forward must read the names below from the module's globals
SUPPORTED = {
    "transformers.models.mamba.modeling_mamba": "MambaMixer",
    "transformers.models.falcon_mamba.modeling_falcon_mamba": "FalconMambaMixer",
}
_NAMES = ("mamba_inner_fn", "causal_conv1d_fn", "causal_conv1d_update", "mamba_selective_scan",
          "mamba_selective_state_update")
_SERVED = ("cpu", "cuda")

_lock = threading.Lock()
_saved = []  # (module, name, original, adapter), in the order enable() bound them


def _selscan_torch():
    import selscan.torch as st
    return st


def _conv_weight(w):
    """(dim, width) from nn.Conv1d's (dim, 1, width) or an already squeezed weight."""
    return w.squeeze(1) if w.dim() == 3 else w


# --------------------------------------------------------------------------------------------------- adapters
# Each adapter takes the original's signature (and its **kwargs: transformers' own wrapper drops the arguments
# the bound implementation does not name) and looks selscan's function up at call time.
def _make_adapters(original):
    def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, seq_idx=None, initial_states=None,
                         return_final_states=False, final_states_out=None, **unused):
        if hidden_states.device.type not in _SERVED:
            return original["causal_conv1d_fn"](hidden_states, weight, bias, activation=activation, seq_idx=seq_idx,
                                                initial_states=initial_states, **unused)
        return _selscan_torch().causal_conv1d_fn(hidden_states, _conv_weight(weight), bias, seq_idx, initial_states,
                                                 return_final_states, final_states_out, activation)

    def causal_conv1d_update(hidden_states, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                             conv_state_indices=None, **unused):
        if hidden_states.device.type not in _SERVED:
            return original["causal_conv1d_update"](hidden_states, conv_state, weight, bias, activation=activation)
        return _selscan_torch().causal_conv1d_update(hidden_states, conv_state, _conv_weight(weight), bias, activation,
                                                     cache_seqlens, conv_state_indices)

    def mamba_selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                             return_last_state=False, **unused):
        if hidden_states.device.type not in _SERVED:
            return original["mamba_selective_scan"](hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus,
                                                    return_last_state, **unused)
        return _selscan_torch().selective_scan_fn(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus,
                                                  return_last_state)

    def mamba_selective_state_update(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False,
                                     z=None, **unused):
        if hidden_states.device.type not in _SERVED:
            return original["mamba_selective_state_update"](state, hidden_states, dt, A, B, C, D, dt_bias,
                                                            dt_softplus, z, **unused)
        return _selscan_torch().selective_state_update(state, hidden_states, dt, A, B, C, D, z=z, dt_bias=dt_bias,
                                                       dt_softplus=dt_softplus)

    def mamba_inner_fn(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                       out_proj_bias, A, B=None, C=None, D=None, delta_bias=None, delta_softplus=True,
                       b_rms_weight=None, c_rms_weight=None, dt_rms_weight=None, b_c_dt_rms_eps=1e-6, **unused):
        if xz.device.type not in _SERVED:
            return original["mamba_inner_fn"](xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight,
                                              out_proj_weight, out_proj_bias, A, B, C, D, delta_bias=delta_bias,
                                              delta_softplus=delta_softplus, b_rms_weight=b_rms_weight,
                                              c_rms_weight=c_rms_weight, dt_rms_weight=dt_rms_weight,
                                              b_c_dt_rms_eps=b_c_dt_rms_eps, **unused)
        if b_rms_weight is not None or c_rms_weight is not None or dt_rms_weight is not None:
            return None  # FalconMamba: the model's own (unfused) definition, see the module docstring
        st = _selscan_torch()
        fused = getattr(st, "mamba_inner_fn", None)
        if fused is not None:
            return fused(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                         out_proj_bias, A, B, C, D, delta_bias=delta_bias, delta_softplus=delta_softplus)
        return _inner_composed(st, xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight,
                               out_proj_weight, out_proj_bias, A, B, C, D, delta_bias, delta_softplus)

    adapters = {"causal_conv1d_fn": causal_conv1d_fn, "causal_conv1d_update": causal_conv1d_update,
                "mamba_selective_scan": mamba_selective_scan,
                "mamba_selective_state_update": mamba_selective_state_update, "mamba_inner_fn": mamba_inner_fn}
    for name, fn in adapters.items():
        fn.__qualname__ = fn.__name__ = name
        fn.__module__ = __name__
        fn._selscan_adapter = True
    return adapters


class _InProj(torch.autograd.Function):
    """in_proj as mamba_ssm's Mamba module computes it: xz = W @ hidden^T (+ bias), a (2*dim, batch*L) matrix whose
    (batch, 2*dim, L) view the fused layer reads with unit stride in L. transformers' MambaMixer computes
    in_proj(hidden).transpose(1, 2) instead, which the layer must copy (and whose gradient in_proj's backward
    copies back): two (batch, 2*dim, L)-sized copies a layer. The backward returns hidden's gradient contiguous."""

    @staticmethod
    def forward(ctx, hidden2, weight, bias):
        ctx.save_for_backward(hidden2, weight)
        ctx.has_bias = bias is not None
        return _in_proj(hidden2, weight, bias)

    @staticmethod
    def backward(ctx, g):
        hidden2, weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        dh = torch.matmul(g.t(), weight) if need[0] else None
        dw = torch.matmul(g, hidden2) if need[1] else None
        db = g.sum(1) if ctx.has_bias and need[2] else None
        return dh, dw, db


def _in_proj(hidden2, weight, bias):
    xz = torch.matmul(weight, hidden2.t())
    if bias is not None:
        xz += bias[:, None]
    return xz


def _plain_linear(m):
    """Whether nn.Linear m computes exactly x @ W^T + b: not a subclass (adapters such as LoRA wrap or subclass
    it) and no hooks."""
    return type(m) is torch.nn.Linear and not m._forward_hooks and not m._forward_pre_hooks


def _fused_forward(original):
    """MambaMixer.forward, sending a call without a cache, an attention mask or extra arguments (training, and
    eval for scoring) through the module's (selscan's) mamba_inner_fn as the training branch calls it, with xz
    from _InProj; everything else to `original`."""
    import transformers.models.mamba.modeling_mamba as mm

    # The mixer's other arguments are named differently across transformers releases (cache_params up to 5.23,
    # cache from 5.24, cache_position before 5.5), so they pass through untouched, by position or by name: a call
    # whose every one of them is None has no cache and no mask.
    def forward(self, hidden_states, *args, **kwargs):
        if (any(a is not None for a in args) or any(v is not None for v in kwargs.values())
                or hidden_states.dim() != 3 or hidden_states.device.type not in _SERVED
                or getattr(self, "_hf_hook", None) is not None or not _plain_linear(self.in_proj)
                or torch.is_autocast_enabled(hidden_states.device.type)):
            return original(self, hidden_states, *args, **kwargs)
        bt, L, _ = hidden_states.shape
        hidden2, w, b = hidden_states.reshape(bt * L, -1), self.in_proj.weight, self.in_proj.bias
        if torch.is_grad_enabled() and (hidden2.requires_grad or w.requires_grad
                                        or (b is not None and b.requires_grad)):
            xz = _InProj.apply(hidden2, w, b)
        else:  # eval: no autograd node to make
            xz = _in_proj(hidden2, w, b)
        projected_states = xz.view(xz.shape[0], bt, L).transpose(0, 1)
        out = mm.mamba_inner_fn(
            projected_states, self.conv1d.weight, self.conv1d.bias if self.use_conv_bias else None,
            self.x_proj.weight, self.dt_proj.weight, self.out_proj.weight,
            self.out_proj.bias.float() if self.use_bias else None, -torch.exp(self.A_log.float()), None, None,
            self.D.float(), delta_bias=self.dt_proj.bias.float(), delta_softplus=True)
        if out is None:  # an adapter that declines
            return original(self, hidden_states, *args, **kwargs)
        return out

    forward.__wrapped__ = original
    forward.__name__ = forward.__qualname__ = "forward"
    forward._selscan_adapter = True
    return forward


def _inner_composed(st, xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, out_proj_weight,
                    out_proj_bias, A, B, C, D, delta_bias, delta_softplus):
    """mamba_ssm's mamba_inner_fn (without rms weights) as selscan's conv1d and scan with torch's matmuls between
    them, differentiable through each; used while selscan.torch has no fused mamba_inner_fn."""
    x, z = xz.chunk(2, dim=1)
    conv = st.causal_conv1d_fn(x, _conv_weight(conv1d_weight), conv1d_bias, activation="silu")
    rank = delta_proj_weight.shape[1]
    x_dbl = F.linear(conv.transpose(1, 2), x_proj_weight)  # (batch, seqlen, rank + 2 * dstate)
    delta = delta_proj_weight @ x_dbl[..., :rank].transpose(1, 2)  # (batch, dim, seqlen)
    if B is None:
        n = A.shape[-1]
        B = x_dbl[..., rank:rank + n].transpose(1, 2)
    if C is None:
        n = A.shape[-1]
        C = x_dbl[..., -n:].transpose(1, 2)
    y = st.selective_scan_fn(conv, delta, A, B, C, D, z, delta_bias, delta_softplus)
    return F.linear(y.transpose(1, 2), out_proj_weight, out_proj_bias)


# --------------------------------------------------------------------------------------------------- enable
def _wrapped_names(fn):
    """The global names read by fn and by every function it wraps: decorators (deprecate_kwarg, accelerate hooks)
    keep the function they wrap in __wrapped__ (functools.wraps) or only in their closure (transformers 5.15's
    force_accelerate_hooks)."""
    names, seen, todo = set(), set(), [fn]
    while todo and len(seen) < 32:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        code = getattr(f, "__code__", None)
        if code is not None:
            names.update(code.co_names)
        if getattr(f, "__wrapped__", None) is not None:
            todo.append(f.__wrapped__)
        for cell in getattr(f, "__closure__", None) or ():
            try:
                inner = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(inner) and hasattr(inner, "__code__"):
                todo.append(inner)
    return names


def _check_layout(module, mixer_name, version):
    mixer = getattr(module, mixer_name, None)
    missing = [n for n in _NAMES if not callable(getattr(module, n, None))]
    used = _wrapped_names(getattr(mixer, "forward", None))
    unread = [n for n in _NAMES if n not in used]
    if mixer is None or missing or unread:
        what = (f"no {mixer_name}" if mixer is None else
                f"missing module-level {', '.join(missing)}" if missing else
                f"{mixer_name}.forward does not call {', '.join(unread)}")
        raise RuntimeError(f"selscan.integrations.transformers: transformers {version} is not supported ({module.__name__}:"
                           f" {what}); supported: transformers >= 5.15, whose mixers call module-level kernel functions "
                           f"(tested: {', '.join(TESTED_VERSIONS)})")


def enable(models=None):
    """Route transformers' Mamba mixers (MambaForCausalLM, FalconMambaForCausalLM) through selscan: the fused
    training call, the causal conv1d and its decode update, the selective scan and the decode step. Affects every
    model of those classes in this process, already built or not. Idempotent; undone by disable().

    models: the modules to patch, keys of SUPPORTED (default: all that this transformers has). Raises RuntimeError
    naming the transformers version when a module's layout is not the one this adapter knows."""
    import importlib

    import transformers

    version = transformers.__version__
    names = list(SUPPORTED) if models is None else [m if m in SUPPORTED else _by_short_name(m) for m in models]
    with _lock:
        done = {id(m) for m, *_ in _saved}
        plan = []
        for name in names:
            try:
                module = importlib.import_module(name)
            except ImportError:
                if models is None:
                    continue  # this transformers has no such model
                raise
            if id(module) in done:
                continue
            _check_layout(module, SUPPORTED[name], version)
            plan.append(module)
        if not plan and not _saved:
            raise RuntimeError(f"selscan.integrations.transformers: transformers {version} has no Mamba module "
                               f"(looked for {', '.join(names)})")
        for module in plan:  # every layout checked before anything is rebound
            original = {n: getattr(module, n) for n in _NAMES}
            adapters = _make_adapters(original)
            for n in _NAMES:
                setattr(module, n, adapters[n])
                _saved.append((module, n, original[n], adapters[n]))
            mixer = getattr(module, SUPPORTED[module.__name__])
            if module.__name__.endswith(".modeling_mamba"):  # FalconMamba: see the module docstring
                own = mixer.forward
                wrapped = _fused_forward(own)
                setattr(mixer, "forward", wrapped)
                _saved.append((mixer, "forward", own, wrapped))


def _by_short_name(m):
    for name in SUPPORTED:
        if name.rsplit(".", 1)[-1] in (m, "modeling_" + m):
            return name
    raise ValueError(f"models: unknown {m!r}; expected one of {', '.join(SUPPORTED)}")


def disable():
    """Put back every function enable() replaced. A name rebound by someone else since enable() is left as it
    is (with a warning). Safe to call when not enabled."""
    with _lock:
        while _saved:
            module, name, original, adapter = _saved.pop()
            if getattr(module, name, None) is adapter:
                setattr(module, name, original)
            else:
                print(f"selscan.integrations.transformers.disable: {module.__name__}.{name} was rebound after "
                      f"enable(); left as it is", file=sys.stderr)


def is_enabled(module=None):
    """Whether enable() is in effect (for one module of SUPPORTED, given by name, or any)."""
    with _lock:
        return any(module is None or m.__name__ == module for m, *_ in _saved)
