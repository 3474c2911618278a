"""selscan.integrations.transformers.enable(): transformers' MambaForCausalLM and FalconMambaForCausalLM, their
model code untouched, run the fused training call, the conv1d, the scan, the conv update and the decode step
through selscan, and give the model's own results (its pure-PyTorch path, the reference): logits, every parameter
gradient, greedy generate() tokens. fp32 on CPU. Skipped without transformers."""

import copy

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")

import selscan.torch as st  # noqa: E402
from selscan.integrations import transformers as sst  # noqa: E402

mm = pytest.importorskip("transformers.models.mamba.modeling_mamba", reason="this transformers has no Mamba model")
if not all(callable(getattr(mm, n, None)) for n in sst._NAMES):
    # Before 5.15 the mixer imports its kernels inside forward: enable() refuses such a release by name.
    with pytest.raises(RuntimeError, match=f"transformers {transformers.__version__} is not supported"):
        sst.enable()
    pytest.skip(f"transformers {transformers.__version__} has no module-level kernel functions for enable() to "
                f"rebind (>= 5.15 has them); enable() refused it by name", allow_module_level=True)

# Tolerances, fp32: both paths compute in float32 and differ in summation order (the reference scan runs a Python
# loop of per-step matmuls, selscan a fused recurrence; the reference conv1d is F.conv1d) and in exp/softplus
# implementations, a few ulps per step. Over 2 layers and 24 steps that stays below ~1e-5 relative (measured:
# <= 1e-6 for the logits); 1e-4 for logits and 1e-3 (relative L2, per parameter) for gradients leave room for
# other CPUs' vector paths and still catch any semantic slip (a wrong bias, softplus, gate or a missing D term
# moves the logits by 1e-2 or more).
LOGIT_TOL = 1e-4
GRAD_TOL = 1e-3
SELSCAN_FNS = ("selective_scan_fn", "selective_state_update", "causal_conv1d_fn", "causal_conv1d_update",
               "mamba_inner_fn")


@pytest.fixture(autouse=True)
def _restore():
    sst.disable()
    yield
    sst.disable()


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of selscan.torch's functions (the adapters look them up at call time)."""
    counts = dict.fromkeys(SELSCAN_FNS, 0)
    for name in SELSCAN_FNS:
        fn = getattr(st, name, None)
        if fn is None:
            continue

        def counted(*a, _fn=fn, _name=name, **k):
            counts[_name] += 1
            return _fn(*a, **k)

        monkeypatch.setattr(st, name, counted)
    return counts


def _mamba(seed=0, **kw):
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(seed)
    kw.setdefault("use_bias", True)  # in_proj / out_proj biases: out_proj's goes through mamba_inner_fn
    cfg = MambaConfig(vocab_size=97, hidden_size=48, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                      time_step_rank=6, use_mambapy=False, **kw)
    return _perturb(MambaForCausalLM(cfg).float())


def _falcon(seed=0, **kw):
    from transformers import FalconMambaConfig, FalconMambaForCausalLM

    torch.manual_seed(seed)
    cfg = FalconMambaConfig(vocab_size=97, hidden_size=48, state_size=8, num_hidden_layers=2, expand=2,
                            conv_kernel=4, time_step_rank=6, use_mambapy=False, **kw)
    return _perturb(FalconMambaForCausalLM(cfg).float())


def _perturb(model):
    """The parameters a fresh model initialises to constants (conv1d and projection biases 0, D and the norms 1)
    get random offsets, as a trained model's have: a term dropped or misplaced on either path then shows."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and float(p.std()) == 0.0:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def _has_falcon():
    try:
        import transformers.models.falcon_mamba.modeling_falcon_mamba  # noqa: F401
        return True
    except ImportError:
        return False


DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                   reason="no CUDA device visible to torch"))]


@pytest.fixture
def device(request, monkeypatch):
    dev = request.param
    if dev == "cuda":  # the reference's F.conv1d would otherwise run in TF32 through cuDNN
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    return torch.device(dev)


MODELS = [pytest.param(_mamba, id="mamba"),
          pytest.param(_falcon, id="falcon_mamba",
                       marks=pytest.mark.skipif(not _has_falcon(), reason="this transformers has no FalconMamba"))]


def _ids(batch=2, seqlen=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 97, (batch, seqlen), generator=g)


def _train_step(model, ids):
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                 if p.grad is not None}


def _x_proj_calls(model):
    """Counts the mixers' x_proj module calls: the fused call (mamba_inner_fn) uses x_proj's weight without
    calling the module, the unfused path calls it once per layer."""
    n = [0]
    for layer in model.backbone.layers:
        layer.mixer.x_proj.register_forward_hook(lambda *a: n.__setitem__(0, n[0] + 1))
    return n


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("inner", ["selscan", "composed"])
@pytest.mark.parametrize("make", MODELS)
def test_training_step_matches_the_model_s_own_path(make, inner, device, calls, monkeypatch):
    """inner: the fused call on selscan.torch.mamba_inner_fn, or (as without one) composed of selscan's conv1d
    and scan with torch's projections between them."""
    if inner == "selscan" and not hasattr(st, "mamba_inner_fn"):
        pytest.skip("this selscan has no selscan.torch.mamba_inner_fn")
    if inner == "composed":
        monkeypatch.delattr(st, "mamba_inner_fn", raising=False)
    ref = make().to(device)
    ours = copy.deepcopy(ref)
    ids = _ids().to(device)
    logits_ref, grads_ref = _train_step(ref, ids)
    assert sum(calls.values()) == 0, f"the reference ran through selscan: {calls}"

    sst.enable()
    x_proj = _x_proj_calls(ours)
    logits, grads = _train_step(ours, ids)
    layers = len(ours.backbone.layers)
    fused = make is _mamba  # FalconMamba's fused call is declined (the model's own dt-norm definition)
    if fused:
        assert x_proj[0] == 0, "MambaMixer did not take the fused path (mamba_inner_fn returned None)"
        if hasattr(st, "mamba_inner_fn"):
            assert calls["mamba_inner_fn"] == layers, calls
        else:
            assert calls["causal_conv1d_fn"] == layers and calls["selective_scan_fn"] == layers, calls
    else:
        assert x_proj[0] == layers
        assert calls["causal_conv1d_fn"] == layers and calls["selective_scan_fn"] == layers, calls

    assert torch.isfinite(logits).all()
    err = _rel(logits, logits_ref)
    assert err <= LOGIT_TOL, f"logits max |diff| / max |ref| = {err:.2e}"
    assert grads.keys() == grads_ref.keys()
    assert len(grads) == sum(1 for p in ours.parameters() if p.requires_grad)
    for name, g_ref in grads_ref.items():
        g = grads[name]
        denom = g_ref.norm().item()
        assert denom > 0, f"{name}: zero reference gradient, the comparison would say nothing"
        e = (g - g_ref).norm().item() / denom
        assert e <= GRAD_TOL, f"{name}: gradient relative L2 error {e:.2e}"


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("make", MODELS)
def test_generate_gives_the_model_s_own_tokens(make, device, calls):
    # Weights 25x the default scale: with the default one a random model's greedy output repeats one token, and
    # a test of identical tokens would say little.
    model = make(initializer_range=0.5).to(device).eval()
    ids = _ids(batch=2, seqlen=12, seed=2).to(device)
    new = 24

    def gen():
        with torch.no_grad():
            return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                  do_sample=False, return_dict_in_generate=True, output_logits=True)

    ref = gen()
    assert sum(calls.values()) == 0
    sst.enable()
    ours = gen()
    layers = len(model.backbone.layers)
    # The prompt: one conv1d and one scan (with its last state) per layer; each later token: one conv update and
    # one decode step per layer.
    assert calls["causal_conv1d_fn"] == layers and calls["selective_scan_fn"] == layers, calls
    assert calls["causal_conv1d_update"] == layers * (new - 1), calls
    assert calls["selective_state_update"] == layers * (new - 1), calls
    assert ours.sequences.device.type == device.type
    assert ours.sequences.shape == ref.sequences.shape == (2, 12 + new)
    assert torch.equal(ours.sequences, ref.sequences), f"tokens differ:\n{ours.sequences}\n{ref.sequences}"
    # Each step's logits too: the prefill's and every decode step's (the state carried from step to step).
    assert len(ours.logits) == len(ref.logits) == new
    for step, (a, b) in enumerate(zip(ours.logits, ref.logits)):
        err = _rel(a, b)
        assert err <= LOGIT_TOL, f"step {step}: logits max |diff| / max |ref| = {err:.2e}"
    # The generated tokens vary (identical constant outputs would tell the paths apart poorly).
    assert len(set(ref.sequences[:, 12:].flatten().tolist())) > 8


def test_enable_disable_round_trip(calls):
    originals = {n: getattr(mm, n) for n in sst._NAMES}
    own_forward = mm.MambaMixer.forward
    model = _mamba().eval()
    ids = _ids()

    def forward():
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False).logits

    ref = forward()
    sst.enable()
    sst.enable()  # idempotent: nothing wrapped twice
    assert sst.is_enabled() and sst.is_enabled(mm.__name__)
    assert all(getattr(mm, n) is not originals[n] for n in sst._NAMES)
    assert len([1 for m, *_ in sst._saved if m is mm]) == len(sst._NAMES)
    assert mm.MambaMixer.forward is not own_forward
    ours = forward()
    n_enabled = dict(calls)
    # An eval forward without a cache or mask takes the fused layer, one call per layer.
    assert n_enabled["mamba_inner_fn"] == 2 and n_enabled["selective_scan_fn"] == 0, n_enabled

    sst.disable()
    assert not sst.is_enabled()
    assert all(getattr(mm, n) is originals[n] for n in sst._NAMES)
    assert mm.MambaMixer.forward is own_forward
    again = forward()
    assert calls == n_enabled, "selscan was called after disable()"
    assert torch.equal(again, ref)

    sst.enable()
    forward()
    assert calls["mamba_inner_fn"] == 4
    assert _rel(ours, ref) <= LOGIT_TOL
    sst.disable()
    sst.disable()  # harmless when not enabled
    assert all(getattr(mm, n) is originals[n] for n in sst._NAMES)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_eval_forward_without_cache_takes_the_fused_layer(device, calls):
    """Prefill for scoring (eval, no cache, no mask) runs the fused layer and matches the model's own path; with an
    attention mask or a cache, or in FalconMamba, the model's forward runs as written (conv1d + scan)."""
    model = _mamba(seed=4).to(device).eval()
    ids = _ids(seed=5).to(device)
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
    sst.enable()
    with torch.no_grad():
        fused = model(input_ids=ids, use_cache=False).logits
    assert calls["mamba_inner_fn"] == 2 and calls["selective_scan_fn"] == 0, calls
    assert _rel(fused, ref) <= LOGIT_TOL
    with torch.no_grad():
        masked = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
        cached = model(input_ids=ids, use_cache=True).logits
    assert calls["mamba_inner_fn"] == 2 and calls["selective_scan_fn"] == 4, calls
    assert _rel(masked, ref) <= LOGIT_TOL and _rel(cached, ref) <= LOGIT_TOL


def test_fused_forward_makes_xz_without_layout_copies(monkeypatch):
    """With enable(), a training step's mixers make xz as a (2*dim, batch*L) GEMM result (sst._InProj): no tensor
    of xz's size is copied in the forward or the backward (transformers' own path copies it twice a layer), and the
    logits and gradients match the model's own path (test_training_step_matches_the_model_s_own_path)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    model = _mamba(seed=6)
    ids = _ids(seqlen=23, seed=7)  # xz's size then differs from every parameter's
    dm2 = model.backbone.layers[0].mixer.in_proj.out_features
    made = [0]
    real = sst._InProj.apply
    monkeypatch.setattr(sst._InProj, "apply", lambda *a: (made.__setitem__(0, made[0] + 1), real(*a))[1])
    copies = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if str(func.overloadpacket) in ("aten.clone", "aten.copy_", "aten._to_copy") and \
                    isinstance(out, torch.Tensor) and out.numel() == ids.numel() * dm2:
                copies.append(str(func.overloadpacket))
            return out

    sst.enable()
    _train_step(model, ids)  # call plans made outside the count
    with Count():
        _train_step(model, ids)
    assert made[0] == 2 * len(model.backbone.layers), made
    assert copies == [], copies


@pytest.mark.parametrize("names", [("cache_params", "attention_mask"), ("cache", "attention_mask"),
                                   ("cache_params", "cache_position", "attention_mask")])
def test_fused_forward_passes_any_release_s_argument_names_through(names, calls):
    """The mixer's arguments after hidden_states are named per release (cache_params up to 5.23, cache from 5.24,
    cache_position before 5.5): whatever the caller names them, all None takes the fused layer, and any set one
    reaches the model's forward as given, by name or by position."""
    model = _mamba(seed=10).eval()
    mixer = model.backbone.layers[0].mixer
    seen = []

    def original(self, hidden_states, *args, **kwargs):  # a stand-in for that release's MambaMixer.forward
        seen.append((args, kwargs))
        return hidden_states[..., :self.out_proj.out_features]

    wrapped = sst._fused_forward(original)
    x = torch.randn(2, 7, model.config.hidden_size)
    sst.enable()
    with torch.no_grad():
        out = wrapped(mixer, x, **dict.fromkeys(names))
    assert seen == [] and calls["mamba_inner_fn"] == 1 and out.shape == x.shape, (seen, calls)
    marker = object()
    for i, name in enumerate(names):
        kw = dict.fromkeys(names)
        kw[name] = marker
        wrapped(mixer, x, **kw)
        assert seen[-1] == ((), kw), (name, seen[-1])
        pos = [None] * len(names)
        pos[i] = marker
        wrapped(mixer, x, *pos)
        assert seen[-1] == (tuple(pos), {}), (name, seen[-1])
    assert calls["mamba_inner_fn"] == 1, calls


def test_hooked_or_adapted_in_proj_keeps_the_model_s_forward(calls):
    """An in_proj with a forward hook (or any nn.Linear subclass, as LoRA adapters install) is called as the
    model calls it: the hook runs, and the step still goes through selscan's fused layer."""
    model = _mamba(seed=8)
    ref = copy.deepcopy(model)
    ids = _ids(seed=9)
    seen = [0]
    for layer in model.backbone.layers:
        layer.mixer.in_proj.register_forward_hook(lambda *a: seen.__setitem__(0, seen[0] + 1))
    logits_ref, _ = _train_step(ref, ids)
    sst.enable()
    logits, _ = _train_step(model, ids)
    assert seen[0] == len(model.backbone.layers)
    assert calls["mamba_inner_fn"] == len(model.backbone.layers), calls
    assert _rel(logits, logits_ref) <= LOGIT_TOL


def test_unsupported_layout_names_the_version_and_changes_nothing(monkeypatch):
    originals = {n: getattr(mm, n) for n in sst._NAMES}
    monkeypatch.delattr(mm, "mamba_selective_state_update")
    with pytest.raises(RuntimeError, match=f"transformers {transformers.__version__} is not supported.*"
                                           f"mamba_selective_state_update"):
        sst.enable()
    assert not sst.is_enabled()
    assert all(getattr(mm, n) is originals[n] for n in sst._NAMES if n != "mamba_selective_state_update")


def test_other_devices_keep_transformers_functions(calls):
    """Tensors on a device selscan does not serve (here: meta) go to the original function."""
    sst.enable()
    u = torch.empty(2, 8, 5, device="meta")
    out = mm.mamba_selective_scan(u, torch.empty_like(u), torch.empty(8, 4, device="meta"),
                                  torch.empty(2, 4, 5, device="meta"), torch.empty(2, 4, 5, device="meta"))
    assert out.shape == (2, 8, 5) and out.device.type == "meta"
    assert sum(calls.values()) == 0


def test_rebound_name_is_left_alone_by_disable(capsys):
    sst.enable()
    original = sst._saved[0][2]
    name = sst._saved[0][1]
    mine = lambda *a, **k: None  # noqa: E731  (someone else's later patch)
    setattr(mm, name, mine)
    sst.disable()
    assert getattr(mm, name) is mine
    assert "rebound after enable()" in capsys.readouterr().err
    setattr(mm, name, original)
