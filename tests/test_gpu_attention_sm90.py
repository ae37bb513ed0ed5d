"""The attention kind's SM90 kernels (CUTLASS examples/88: TMA + wgmma, warp-specialized) on a
Hopper GPU, built in-process as a user on the GPU host builds them, against torch's
scaled_dot_product_attention in float64 on the same inputs: fp16 and bf16, head dims 64 and 128,
non-causal and TVM's causal masks (TopLeft = torch's is_causal; BottomRight = key j seen by query i
iff j <= i + |S - T|, given to torch as a boolean mask), odd sequence lengths (77, 1000, 4096; seq_q
!= seq_kv both ways), a symbolic sequence length, heads split from a (B, S, N*H) projection (the
kernel reads strides), every schedule and tile, head dims without an SM90 kernel of their own (96, 80, 32) run padded
on the next wider one, and the SM80 fallback (family="sm80") with causal masks.

    pytest -m gpu tests/test_gpu_attention_sm90.py   (on the GPU host; skipped without a Hopper GPU)
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

import relax_cutlass  # noqa: E402
from relax_cutlass.arch import local_gpu_arch  # noqa: E402
from relax_cutlass.kinds.attention.select import sm90_bias_head_dims  # noqa: E402
from relax_cutlass.testing import gpu_convs  # noqa: E402  (skips this module without a GPU, torch or TVM's compiler)
from relax_cutlass.testing.attention import rotary_table  # noqa: E402
from relax_cutlass.testing.errors import rel_error  # noqa: E402
from relax_cutlass.testing.zoo import float64_reference  # noqa: E402

if local_gpu_arch() != 90:
    pytest.skip("SM90 kernels need a Hopper GPU", allow_module_level=True)

torch, tvm, relax = gpu_convs.torch, gpu_convs.tvm, gpu_convs.relax

# (dtype, head dim, causal, batch, heads, seq_q, seq_kv)
CASES = [
    ("float16", 128, None, 2, 8, 1000, 1000),
    ("float16", 128, "TopLeft", 2, 8, 1000, 1000),
    ("float16", 64, None, 2, 8, 77, 77),
    ("float16", 64, "TopLeft", 1, 4, 4096, 4096),
    ("bfloat16", 128, "TopLeft", 2, 4, 77, 77),
    ("bfloat16", 64, None, 1, 8, 4096, 4096),
    ("bfloat16", 128, None, 3, 2, 333, 1000),
    ("float16", 128, "BottomRight", 2, 4, 77, 1000),  # S < T: the last query sees every key
    ("float16", 64, "BottomRight", 2, 4, 1000, 77),  # S > T: TVM's offset |S - T| (not T - S)
    ("float16", 128, "TopLeft", 2, 4, 1000, 77),
    ("bfloat16", 64, "BottomRight", 1, 2, 4096, 4096),
]


def _module(cases):
    """One function per case: R.nn.attention on BSNH q, k, v parameters."""
    bb = relax.BlockBuilder()
    for i, (dtype, hd, causal, b, n, s, t) in enumerate(cases):
        q = relax.Var("q", relax.TensorType((b, s, n, hd), dtype))
        k = relax.Var("k", relax.TensorType((b, t, n, hd), dtype))
        v = relax.Var("v", relax.TensorType((b, t, n, hd), dtype))
        with bb.function(f"f{i}", [q, k, v]):
            with bb.dataflow():
                out = bb.emit_output(relax.op.nn.attention(q, k, v, causal_mask=causal))
            bb.emit_func_output(out)
    return bb.get()


def _inputs(case, rng):
    dtype, hd, _, b, n, s, t = case
    shapes = ((b, s, n, hd), (b, t, n, hd), (b, t, n, hd))
    return [rng.uniform(-1, 1, size=shape).astype(dtype) for shape in shapes]


def sdpa_float64(q, k, v, causal, scale=None):
    """torch's sdpa in float64 on the GPU, on BSNH numpy arrays; TVM's causal masks."""
    q, k, v = (torch.from_numpy(x.astype("float64")).cuda().transpose(1, 2) for x in (q, k, v))
    s, t = q.shape[2], k.shape[2]
    mask = None
    if causal == "BottomRight":
        mask = torch.arange(t, device="cuda")[None, :] <= torch.arange(s, device="cuda")[:, None] + abs(s - t)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal == "TopLeft", scale=scale
    )
    return out.transpose(1, 2).cpu().numpy()


def _check(vm, name, inputs, causal, dtype, scale=None):
    dev = tvm.cuda(0)
    got = vm[name](*[tvm.runtime.tensor(x, dev) for x in inputs]).numpy().astype("float64")
    want = sdpa_float64(*inputs, causal, scale)
    err = rel_error(got, want)
    assert err < (1e-2 if dtype == "bfloat16" else 2e-3), (name, causal, err)
    return err


def _attention_launches(vm, name, inputs) -> int:
    """How many attention kernels one call of `vm[name]` launches (CUPTI, through torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    vm[name](*args)
    dev.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        vm[name](*args)
        dev.sync()
    kernels = ("attention_kernel_batched_impl", "fmha", "(anonymous namespace)::Kernel>")
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA" and any(k in e.name for k in kernels))


def _build(mod, left_in_tvm_ok=lambda row: False, **options):
    offloaded = relax_cutlass.offload_pipeline("sm_90a", profile="never", **options)(mod)
    report = relax_cutlass.offload_report(offloaded)
    assert not [row for row in report.left_in_tvm if not left_in_tvm_ok(row)], str(report)
    vm = relax.VirtualMachine(tvm.compile(offloaded, gpu_convs.cuda_target()), tvm.cuda(0))
    return vm, report.offloaded


def test_sm90_attention_matches_sdpa_float64():
    vm, rows = _build(_module(CASES))
    assert len(rows) == len(CASES) and all(r["family"] == "sm90" for r in rows), rows
    rng = np.random.default_rng(0)
    for i, case in enumerate(CASES):
        _check(vm, f"f{i}", _inputs(case, rng), case[2], case[0])


def test_sm90_pingpong_schedule_matches_sdpa():
    """The ping-pong schedule (persistent, Q loaded by its own warp) with head dim 64's 128 x 64
    tile, forced first (the heuristic's pingpong at head dim 64 is 128 x 128)."""
    from relax_cutlass.kinds.attention import select

    cases = [CASES[1], CASES[2], CASES[8]]
    with select.sm90_candidate_first("pingpong", (128, 64)):
        vm, rows = _build(_module(cases))
    assert all("_pingpong_" in r["kernel"] for r in rows), rows
    rng = np.random.default_rng(1)
    for i, case in enumerate(cases):
        _check(vm, f"f{i}", _inputs(case, rng), case[2], case[0])


@pytest.mark.parametrize(
    "schedule, tile",
    [
        ("cooperative", None),
        ("cooperative_locked", None),
        ("pingpong_locked", None),
        ("cooperative", (128, 64)),
        ("cooperative_locked", (128, 64)),
        ("pingpong_locked", (128, 64)),
    ],
)
def test_sm90_candidate_schedules_and_tiles_match_sdpa(schedule, tile):
    """The candidates profiling times besides the heuristic's (pingpong 128 x 128 at head dim 64,
    cooperative at 128): the warp groups' ordered softmax (kIsMainloopLocked), persistent or not,
    and head dim 64's 128 x 64 tile, each forced first. With test_sm90_pingpong_schedule_matches_sdpa
    and the heuristic's own test, every head-dim-64 candidate runs."""
    from relax_cutlass.kinds.attention import select

    cases = [CASES[1], CASES[3], CASES[8], CASES[9], CASES[5]]
    with select.sm90_candidate_first(schedule, tile):
        vm, rows = _build(_module(cases))
    assert all(f"_{schedule}_q128_" in r["kernel"] for r in rows), rows
    keys = (tile or (128, 128))[1]
    assert all(f"_k{keys}_h64" in r["kernel"] for r in rows if r["kernel"].split("_causal")[0].endswith("h64")), rows
    rng = np.random.default_rng(5)
    for i, case in enumerate(cases):
        _check(vm, f"f{i}", _inputs(case, rng), case[2], case[0])


# Head dims without an SM90 kernel of their own, run on the next wider one padded
PADDED_CASES = [
    ("float16", 96, "TopLeft", 1, 32, 512, 512),  # Phi-3 mini's prefill
    ("float16", 96, None, 2, 4, 77, 77),
    ("float16", 96, "BottomRight", 2, 4, 77, 1000),
    ("bfloat16", 80, None, 2, 8, 1000, 1000),  # Phi-2's head dim
    ("float16", 32, "TopLeft", 2, 4, 333, 333),  # padded to 64
]
# A head dim the heuristic does not yet run padded (not in select.SM90_PADDED_FIRST): the SM80
# kernel, with the padded SM90 kernel timed beside it when profiling
UNMEASURED_PADDED_CASE = ("float16", 112, "TopLeft", 1, 32, 512, 512)


@pytest.mark.parametrize("schedule", ["cooperative", "pingpong", "cooperative_locked", "pingpong_locked"])
def test_head_dims_without_their_own_sm90_kernel_run_padded(schedule):
    """Phi-3's head dim 96 (and 80, 32) on the SM90 kernel of the next wider head dim, every
    schedule forced first: TMA zero-fills the head columns past the problem's, and O's store stops
    at them (select.sm90_padded_head_dim), against torch's float64 sdpa."""
    from relax_cutlass.kinds.attention import select

    with select.sm90_candidate_first(schedule, padded_head_dims={case[1] for case in PADDED_CASES}):
        vm, rows = _build(_module(PADDED_CASES))
    assert all(r["family"] == "sm90" and "padded to" in r["note"] for r in rows), rows
    assert all(f"_{schedule}_q128_" in r["kernel"] for r in rows), rows
    rng = np.random.default_rng(6)
    for i, case in enumerate(PADDED_CASES):
        _check(vm, f"f{i}", _inputs(case, rng), case[2], case[0])


# Gemma's head dim 256 on examples/88's 128 x 64 tile (select.SM90_UNMEASURED_HEAD_DIMS: not
# yet the heuristic's)
HEAD_DIM_256_CASES = [
    ("float16", 256, None, 2, 4, 333, 333),
    ("bfloat16", 256, "TopLeft", 1, 8, 1024, 1024),
    ("float16", 256, "BottomRight", 2, 2, 77, 500),
]


@pytest.mark.parametrize("schedule", ["cooperative", "cooperative_locked"])
def test_head_dim_256_runs_on_its_sm90_tile(schedule):
    """Every schedule of the head-dim-256 kernel forced first (select.SM90_HEAD_DIM_SCHEDULES: the
    cooperative ones), against torch's float64 sdpa."""
    from relax_cutlass.kinds.attention import select

    with select.sm90_candidate_first(schedule, measured_head_dims=[256]):
        vm, rows = _build(_module(HEAD_DIM_256_CASES))
    assert all(r["family"] == "sm90" and f"_{schedule}_q128_k64_h256" in r["kernel"] for r in rows), rows
    rng = np.random.default_rng(8)
    for i, case in enumerate(HEAD_DIM_256_CASES):
        _check(vm, f"f{i}", _inputs(case, rng), case[2], case[0])


def test_profiling_times_the_padded_sm90_kernels_beside_the_sm80_one(tmp_path):
    """profile="auto" on a head dim 112 attention: one record (the SM80 family's key) holding the
    SM80 kernel's tile and every padded SM90 candidate, each checked against the reference (a
    failed check records None); the build takes the fastest and is right. The timings printed are
    the measurement SM90_PADDED_FIRST waits for (head dims 96, 80 and 32 were measured and are in
    it, so their heuristic runs the SM90 kernel and profiling times only SM90 candidates)."""
    import json

    case = UNMEASURED_PADDED_CASE
    db = tmp_path / "tuning.jsonl"
    offloaded = relax_cutlass.offload_pipeline("sm_90a", profile="auto", tuning_db=str(db))(_module([case]))
    (record,) = [r for r in map(json.loads, db.read_text().splitlines()) if r["key"]["op"] == "attention"]
    times = record["candidates"]
    print("head dim 112 candidates (ms):", json.dumps(times))
    assert "q32_k128" in times and sum(label.endswith("_q128_k128") for label in times) == 4, times
    assert all(ms is not None for ms in times.values()), times
    (row,) = [r for r in relax_cutlass.offload_report(offloaded).offloaded if r["op"] == "attention"]
    assert row["selected_by"] == "tuned", row
    vm = relax.VirtualMachine(tvm.compile(offloaded, gpu_convs.cuda_target()), tvm.cuda(0))
    _check(vm, "f0", _inputs(case, np.random.default_rng(7)), case[2], case[0])


@pytest.mark.parametrize("causal", [None, "TopLeft"])
def test_sm90_attention_symbolic_sequence_length(causal):
    seq = tvm.tirx.Var("seq", "int64")
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(x, relax.TensorType((2, seq, 8, 128), "float16")) for x in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.attention(q, k, v, causal_mask=causal))
        bb.emit_func_output(out)
    vm, (row,) = _build(bb.get())
    assert row["family"] == "sm90" and row["attention"]["seq_q"] == "dynamic", row
    rng = np.random.default_rng(2)
    for s in (77, 1000, 4096, 1):
        _check(vm, "main", _inputs(("float16", 128, causal, 2, 8, s, s), rng), causal, "float16")


def test_sm90_attention_reads_heads_split_from_a_projection():
    """softmax(q k^T / sqrt(H)) v as torch.export writes a BERT layer: q, k, v are (B, S, N*H)
    projections whose heads the kernel reads through strides."""

    from relax_cutlass.testing.attention import torch_export_attention

    b, s, n, h = 2, 77, 8, 64
    mod = torch_export_attention(b=b, s=s, n=n, h=h)
    vm, (row,) = _build(mod)
    assert row["family"] == "sm90" and row["shapes"]["query"] in ([b, s, n * h], [b, s, n, h]), row
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (b, s, n * h)).astype("float16")
    y = rng.uniform(-1, 1, (b, s, n * h)).astype("float16")
    dev = tvm.cuda(0)
    got = vm["main"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(y, dev)).numpy().astype("float64")
    q, k = x.reshape(b, s, n, h), y.reshape(b, s, n, h)
    v = (y * np.float16(0.5)).reshape(b, s, n, h)
    want = sdpa_float64(q, k, v, None).reshape(b, s, n * h)
    assert rel_error(got, want) < 5e-3


def test_sm80_fallbacks_on_hopper_run_and_say_why():
    """family='sm80' (examples/41, the causal mask now a run-time argument of it) and a head dim
    the SM90 kernel is not built for and the heuristic does not run padded (112), causal both ways."""
    cases = [CASES[1], CASES[8], ("float16", 112, "BottomRight", 2, 4, 1000, 77), ("float16", 112, None, 2, 4, 77, 77)]
    vm, rows = _build(_module(cases[:2]), family="sm80")
    assert all(r["family"] == "sm80" and "family='sm80'" in r["note"] for r in rows), rows
    rng = np.random.default_rng(4)
    for i, case in enumerate(cases[:2]):
        _check(vm, f"f{i}", _inputs(case, rng), case[2], case[0])
        # One launch over every head (a kv_group loop running the whole attention once per head
        # made a padded BERT-base spend 1.67 of its 2.7 ms there).
        assert _attention_launches(vm, f"f{i}", _inputs(case, rng)) == 1
    vm, rows = _build(_module(cases[2:]))
    assert all(r["family"] == "sm80" and "head dims 112/112" in r["note"] for r in rows), rows
    for i, case in enumerate(cases[2:]):
        _check(vm, f"f{i}", _inputs(case, rng), case[2], case[0])


@pytest.mark.parametrize("family", ["auto", "sm80"])
@pytest.mark.parametrize("kind, s, t", [("top_left", 1000, 1000), ("bottom_right", 333, 1000)])
def test_an_arange_built_causal_mask_runs_as_the_kernels_causal_mask(family, kind, s, t):
    """A decoder's mask built from aranges (Hugging Face's form: where(j <= i + d, 0, finfo.min))
    in front of a decomposed attention, as torch.export writes it: evaluated at build time and run
    as the kernel's causal mask (SM90 by default; the SM80 kernel's run-time flag), no mask tensor."""

    from relax_cutlass.testing.models.torch_attention import CausalAttention

    b, n, h = 2, 8, 128
    q, k, v = torch.randn(b, n, s, h), torch.randn(b, n, t, h), torch.randn(b, n, t, h)
    mod = relax_cutlass.from_torch(CausalAttention(kind, float(np.finfo("float32").min)), (q, k, v))
    vm, (row,) = _build(mod, **({} if family == "auto" else {"family": family}))
    causal = "TopLeft" if kind == "top_left" else "BottomRight"
    assert row["attention"]["causal"] == causal and "bias" not in row["attention"], row
    assert row["family"] == ("sm90" if family == "auto" else "sm80"), row
    _check_float32_model(vm, (q, k, v), causal)


def _check_float32_model(vm, example, causal):
    """The exported model takes float32 (it runs in float16 inside): fp16-exact float32 inputs,
    checked against torch's float64 sdpa (k and v repeated to the query heads where grouped)."""
    rng = np.random.default_rng(5)
    bnsh = [rng.uniform(-1, 1, size=x.shape).astype("float16").astype("float32") for x in example]
    dev = tvm.cuda(0)
    out = vm["main"](*[tvm.runtime.tensor(x, dev) for x in bnsh])
    got = (out if hasattr(out, "numpy") else out[0]).numpy().astype("float64")  # from_torch: a tuple
    group = bnsh[0].shape[1] // bnsh[1].shape[1]
    q, k, v = bnsh[0], *(np.repeat(x, group, axis=1) for x in bnsh[1:])
    want = sdpa_float64(*[x.transpose(0, 2, 1, 3) for x in (q, k, v)], causal)  # (B, S, N, H) as the model's
    assert rel_error(got, want) < 2e-3


@pytest.mark.parametrize("family", ["auto", "sm80"])
@pytest.mark.parametrize("kind, batch", [("top_left", 2), ("none", 1)])
def test_grouped_query_attention_reads_each_kv_head_for_its_group(family, kind, batch):
    """transformers' repeat_kv in front of the attention (8 query heads over 2 kv heads): the
    repeat is never written: the SM90 kernel in one launch over every (batch, query head), each
    CTA loading its query head's kv head (emit_sm90.GroupedMainloop), the SM80 kernel one launch
    per kv head."""

    from relax_cutlass.testing.models.torch_attention import CausalAttention

    n, group, s, h = 8, 4, 1000, 128
    q = torch.randn(batch, n, s, h)
    k, v = torch.randn(batch, n // group, s, h), torch.randn(batch, n // group, s, h)
    mod = relax_cutlass.from_torch(CausalAttention(kind, group=group), (q, k, v))
    vm, (row,) = _build(mod, **({} if family == "auto" else {"family": family}))
    assert row["attention"]["kv_heads"] == n // group and row["family"] == ("sm90" if family == "auto" else "sm80")
    assert row["attention"].get("causal") == ("TopLeft" if kind == "top_left" else None), row
    _check_float32_model(vm, (q, k, v), row["attention"].get("causal"))
    example = [x.numpy() for x in (q, k, v)]
    # The SM90 kernel: one launch; the SM80 kernel: one per kv head.
    assert _attention_launches(vm, "main", example) == (1 if family == "auto" else n // group)


@pytest.mark.parametrize(
    "family, form, batch",
    [
        ("auto", "causal", 2),
        ("sm80", "causal", 2),
        ("auto", "padding", 2),
        ("sm80", "padding", 2),
        ("sm90", "padding", 2),
    ],
)
def test_multi_query_attention_reads_its_one_kv_head_for_every_query_head(family, form, batch):
    """Falcon's multi-query attention (one kv head broadcast over 8 query heads by sdpa, causal or
    with a padding mask): one region, one launch, against torch in float64. "sm90" (and "auto",
    the heuristic's): the padding mask as the SM90 kernel's bias (select.SM90_BIAS_FIRST), read
    per (batch, query head) CTA."""

    from relax_cutlass.testing.models.torch_attention import MultiQueryAttention

    n, s, h = 8, 1000, 128
    q, k, v = torch.randn(batch, n, s, h), torch.randn(batch, 1, s, h), torch.randn(batch, 1, s, h)
    keep = torch.ones(batch, s, dtype=torch.bool)
    keep[-1, s // 3 :] = False
    module = MultiQueryAttention(form)
    mod = relax_cutlass.from_torch(module, (q, k, v, keep))
    with _bias_family(family):
        vm, (row,) = _build(mod, **({"family": family} if family == "sm80" else {}))
    assert row["attention"]["kv_heads"] == 1 and row["attention"]["heads"] == n, row
    assert family != "sm90" or row["kernel"].endswith("_bias") and row["family"] == "sm90", row
    rng = np.random.default_rng(6)
    inputs = [rng.uniform(-1, 1, size=x.shape).astype("float16").astype("float32") for x in (q, k, v)]
    inputs.append(keep.numpy())
    out = vm["main"](*[tvm.runtime.tensor(x, tvm.cuda(0)) for x in inputs])
    got = (out if hasattr(out, "numpy") else out[0]).numpy().astype("float64")
    with torch.no_grad():
        want = module(*[torch.from_numpy(x).double() if x.dtype != bool else torch.from_numpy(x) for x in inputs])
    assert rel_error(got, want.numpy()) < 2e-3
    launches = _attention_launches(vm, "main", inputs)
    assert launches == 1, (row["family"], launches)


@pytest.mark.parametrize("family", ["auto", "sm80"])
@pytest.mark.parametrize("model", ["vit", "gpt2"])
def test_packed_projection_is_read_in_place(family, model):
    """q, k and v sliced out of one packed projection (torch's nn.MultiheadAttention in a ViT;
    GPT-2's split), read in place at their offsets by both kernel families: the whole model
    against torch in float64."""

    from relax_cutlass.testing.harness import small_transformer
    from relax_cutlass.testing.models.torch_models import vit
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    if model == "vit":  # head dim 64: the SM90 kernel's
        module, example = vit(image=64, patch=16, hidden=128, layers=2, heads=2), (torch.randn(2, 3, 64, 64),)
    else:  # head dim 32: the SM80 kernel either way
        module, example = last_hidden_state(small_transformer("gpt2", "eager")), (torch.randint(0, 512, (2, 64)),)
    mod = relax_cutlass.from_torch(module, example)
    offloaded = relax_cutlass.offload_pipeline(
        "sm_90a", profile="never", **({} if family == "auto" else {"family": family})
    )(mod)
    rows = [r for r in relax_cutlass.offload_report(offloaded).offloaded if r["op"] == "attention"]
    assert rows and all(set(r["attention"]["packed"]) == {"query", "key", "value"} for r in rows), rows
    vm = relax.VirtualMachine(tvm.compile(offloaded, gpu_convs.cuda_target()), tvm.cuda(0))
    out = vm["main"](*[tvm.runtime.tensor(x.numpy(), tvm.cuda(0)) for x in example])
    got = (out if hasattr(out, "numpy") else out[0]).numpy().astype("float64")
    with torch.no_grad():
        want = module.double()(*[x.double() if x.is_floating_point() else x for x in example])
    want = (want[0] if isinstance(want, tuple) else want).numpy()
    assert rel_error(got, want) < 1e-2


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_symbolic_length_attention_runs_with_its_mask_as_bias(family):
    """A transformer exported with a symbolic sequence length (torch.export.Dim): its attention is
    one region on the SM80 kernel with the run-time mask read as an additive bias, right at lengths
    other than the example's."""

    from relax_cutlass.testing.harness import small_transformer
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    module = last_hidden_state(small_transformer(family, layers=1))
    seq = torch.export.Dim("seq", min=2, max=512)
    mod = relax_cutlass.from_torch(module, (torch.randint(0, 512, (1, 16)),), dynamic_shapes={"input_ids": {1: seq}})
    # with a symbolic length the rotary table is not a constant: its float32 outer product stays
    # in TVM, the one row left there that the check allows
    vm, rows = _build(mod, left_in_tvm_ok=rotary_table)
    attention = [r for r in rows if r["op"] == "attention"]
    assert len(attention) == 1 and attention[0]["attention"]["seq_q"] == "dynamic", attention
    for n in (7, 300):
        got, want = _ids_on_gpu_and_in_torch(vm, module, torch.randint(0, 512, (1, n)))
        assert got.shape == want.shape and rel_error(got, want) < 1e-2


def _ids_on_gpu_and_in_torch(vm, module, ids):
    """(the built module's output for token `ids`, torch's in float64), float64 numpy."""
    out = vm["main"](tvm.runtime.tensor(ids.numpy(), tvm.cuda(0)))
    got = (out if hasattr(out, "numpy") else out[0]).numpy().astype("float64")
    with torch.no_grad():
        want = module.double()(ids)
    return got, (want[0] if isinstance(want, tuple) else want).numpy()


def _bias_family(family: str):
    """The attention kind's kernel for masks/biases: "sm90" (the heuristic's at head dims 64 and
    128 from 128 queries on: select.SM90_BIAS_FIRST; here at any length) or any other (the SM80
    kernel, SM90_BIAS_FIRST emptied)."""
    return sm90_bias_head_dims((64, 128), 0) if family == "sm90" else sm90_bias_head_dims(())


def _gpt2_one_layer():
    """A one-layer GPT-2 with transformers' eager attention (its finfo.min mask at batch > 1)."""
    from relax_cutlass.testing.harness import small_transformer
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    return last_hidden_state(small_transformer("gpt2", "eager", layers=1))


def _left_padded(n: int, padded: int):
    """Token ids of a batch of 2, and its mask: the second sequence's first `padded` tokens padding."""
    ids = torch.randint(0, 512, (2, n))
    mask = torch.ones(2, n, dtype=torch.int64)
    mask[1, :padded] = 0
    return ids, mask


def _batch_on_gpu_and_in_torch(vm, module, ids, mask, reference_dtype):
    """(the built module's output, torch's in `reference_dtype`), float64 numpy, every row. float64
    is the zoo's reference: float32 for what float64 leaves non-finite (an eager decoder's fully
    masked rows, where two mask minimums added overflow)."""
    import copy

    dev = tvm.cuda(0)
    out = vm["main"](tvm.runtime.tensor(ids.numpy(), dev), tvm.runtime.tensor(mask.numpy(), dev))
    got = (out if hasattr(out, "numpy") else out[0]).numpy().astype("float64")
    if reference_dtype == torch.float64:
        return got, float64_reference(module, (ids, mask))
    with torch.no_grad():
        want = copy.deepcopy(module).to(reference_dtype)(ids, mask)
    return got, (want[0] if isinstance(want, tuple) else want).numpy().astype("float64")


@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_gpt2_left_padded_batch_with_a_symbolic_length_is_right(family):
    """GPT-2 (eager attention: batch 2) with a left-padded batch and a symbolic length: its finfo.min
    mask runs as the kernel's bias with "mean" rows (the 1/T of a fully masked row, for a symbolic
    T, is the softmax of a row of zeros; the SM90 kernel once gave such rows zeros). Every row,
    padded ones included, against torch float64, at two lengths."""
    module = _gpt2_one_layer()
    seq = torch.export.Dim("seq", min=2, max=512)
    mod = relax_cutlass.from_torch(
        module, _left_padded(48, 16), dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}}
    )
    with _bias_family(family):
        vm, rows = _build(mod)
    attention = [r for r in rows if r["op"] == "attention"]
    assert len(attention) == 1 and attention[0]["attention"]["masked_rows"] == "mean", attention
    assert attention[0]["kernel"].startswith(f"{family}_"), attention
    for n in (29, 300):
        got, want = _batch_on_gpu_and_in_torch(vm, module, *_left_padded(n, n // 3), torch.float64)
        assert got.shape == want.shape and rel_error(got, want) < 1e-2, n


@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_a_bfloat16_left_padded_batch_is_right(family):
    """GPT-2 in bfloat16 on a left-padded batch: its finfo(float32).min mask runs as a bfloat16
    bias holding -2**100 for the minimum (masks.BFLOAT16_SWAMPING_MASK), which the kernels scale
    in float32 without overflowing, so the first queries of the padded sequence, which see no key,
    keep the mean of the values. Every row against torch float32."""
    module = _gpt2_one_layer()
    ids, mask = _left_padded(96, 32)
    mod = relax_cutlass.from_torch(module, (ids, mask), dtype="bfloat16")
    with _bias_family(family):
        vm, rows = _build(mod)
    attention = [r for r in rows if r["op"] == "attention"]
    assert len(attention) == 1 and attention[0]["kernel"].startswith(f"{family}_"), attention
    got, want = _batch_on_gpu_and_in_torch(vm, module, ids, mask, torch.float32)
    assert np.isfinite(got).all() and rel_error(got, want) < 4e-2


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_a_left_padded_llama_batch_is_right(family, attn_implementation):
    """A batched Llama prefill with left padding (4 query heads over 2 kv heads; causal and
    padding in one (B, 1, S, S) mask): one region, the causal part the kernel's causal mask and
    the padding a (B, 1, 1, T) bias, every kv head read for its group, the padded sequence's first
    rows (no key to see) as torch gives them. Every row against torch float64 (float32 where eager
    overflows in float64: testing.zoo.float64_reference)."""
    from relax_cutlass.testing.harness import small_transformer
    from relax_cutlass.testing.models.torch_transformers import last_hidden_state

    torch.manual_seed(0)
    module = last_hidden_state(small_transformer("llama", attn_implementation, layers=1))
    ids, mask = _left_padded(96, 32)
    mod = relax_cutlass.from_torch(module, (ids, mask))
    with _bias_family(family):
        # the positions count the kept tokens (a cumsum of the mask): the rotary table is computed
        # from an input, so its float32 outer product stays in TVM
        vm, rows = _build(mod, left_in_tvm_ok=rotary_table)
    (attention,) = [r for r in rows if r["op"] == "attention"]
    # the causal part runs as the kernel's causal mask beside a (B, 1, 1, T) bias; eager's fully
    # masked rows give the mean of every value, which each kernel's fix-up writes (the SM90 one's
    # after the kernel: FixCausalMeanRows)
    assert attention["kernel"].startswith(f"{family}_") and attention["kernel"].endswith("_bias"), attention
    assert attention["attention"]["kv_heads"] == 2 and attention["attention"]["causal"] == "TopLeft", attention
    assert attention["attention"]["bias"] == "B11T", attention
    got, want = _batch_on_gpu_and_in_torch(vm, module, ids, mask, torch.float64)
    assert got.shape == want.shape and rel_error(got, want) < 1e-2


@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_bloom_alibi_beside_the_causal_mask_is_right(family):
    """BLOOM's ALiBi (a (B, N, 1, T) bias, cast from float32) beside the kernel's own causal mask,
    both in one region: every row against torch float64."""
    import transformers

    from relax_cutlass.testing.models.torch_transformers import TINY_VOCAB, tiny_model

    torch.manual_seed(0)
    module = tiny_model("bloom", torch, transformers)
    ids = torch.randint(3, TINY_VOCAB, (2, 96))
    mod = relax_cutlass.from_torch(module, (ids,))
    with _bias_family(family):
        vm, rows = _build(mod)
    attention = [r for r in rows if r["op"] == "attention"]
    assert sum(r["calls"] for r in attention) == 2, attention
    for row in attention:
        assert row["kernel"].startswith(f"{family}_") and row["kernel"].endswith("_bias"), row
        assert row["attention"]["bias"] == "BN1T" and row["attention"]["causal"] == "TopLeft", row
    got, want = _ids_on_gpu_and_in_torch(vm, module, ids)
    assert got.shape == want.shape and rel_error(got, want) < 1e-2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mask_shape": "b11t", "s": 9, "t": 13},  # a padding mask over 13 keys
        {"mask_shape": "b1st", "s": 77, "t": 77},  # one mask row per query, 77 keys
        {"mask_shape": "bnst", "mask": "float16", "s": 20, "t": 30},  # an fp16 bias per head
    ],
)
@pytest.mark.parametrize("family", ["sm90", "sm80"])
def test_a_bias_off_16_byte_rows_is_right(kwargs, family):
    """Key counts off a multiple of 8 with a mask/bias (the SM80 kernel's run function copies the
    bias into 16-byte rows, PadBiasRows; the SM90 kernel reads any row): against TVM's llvm build
    of the same graph, fully masked first rows included."""

    from relax_cutlass.testing.attention import masked_inputs, sdpa_attention
    from relax_cutlass.testing.harness import build_cpu, run_vm

    mod = sdpa_attention(h=64, **kwargs)  # a head dim of the SM90 kernel's
    with _bias_family(family):
        vm, rows = _build(mod)
    (row,) = [r for r in rows if r["op"] == "attention"]
    assert row["kernel"].startswith(f"{family}_"), row
    assert row["kernel"].endswith("_bias"), row
    inputs = masked_inputs(mod)
    want = run_vm(build_cpu(mod), inputs).astype("float64")
    out = vm["main"](*[tvm.runtime.tensor(a, tvm.cuda(0)) for a in inputs])
    got = (out if hasattr(out, "numpy") else out[0]).numpy().astype("float64")
    assert got.shape == want.shape and np.isfinite(got).all()
    assert rel_error(got, want) < 1e-2
