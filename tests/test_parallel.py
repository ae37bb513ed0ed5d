"""Tensor parallelism (relax_cutlass.parallel) without GPUs: each rank's PyTorch shard, the offloaded
per-rank module (one graph, the all-reduces after the row-parallel projections, each rank's weights
lifted to parameters), the ranks run together on the CPU (testing.parallel: threads, the all-reduce
summed in numpy) against the unsharded model, a group of one through disco's process session, and
disco's NCCL backend built from the source the TVM wheel ships."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from relax_cutlass import from_torch  # noqa: E402
from relax_cutlass.parallel import (  # noqa: E402
    TensorParallelModule,
    lift_weights,
    offload_tensor_parallel,
    shard_model,
)
from relax_cutlass.parallel.collectives import summing_with  # noqa: E402
from relax_cutlass.testing.errors import rel_error  # noqa: E402
from relax_cutlass.testing.harness import CPU, offload_for_cpu, partition_for_cpu, serve_regions_on_cpu  # noqa: E402
from relax_cutlass.testing.parallel import SummingGroup, run_ranks_on_cpu  # noqa: E402
from relax_cutlass.toolkit.settings import SettingError  # noqa: E402

ARCH = "sm_90a"


def _model(family: str, layers: int = 2):
    """A random-init decoder of `family` with 4 query heads over 2 kv heads (Qwen2: q/k/v biases)."""
    torch.manual_seed(0)
    common = dict(
        hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=layers, vocab_size=512,
    )  # fmt: skip
    if family == "qwen2":
        return transformers.Qwen2Model(transformers.Qwen2Config(**common)).eval()
    return transformers.LlamaModel(transformers.LlamaConfig(**common)).eval()


def _ids(batch: int = 2, seq: int = 16):
    return torch.randint(0, 512, (batch, seq), generator=torch.Generator().manual_seed(1))


def _run_shards_in_torch(shards, ids) -> list[torch.Tensor]:
    """Each rank's torch module in its own thread, their tensor_parallel_sums exchanged."""
    group = SummingGroup(len(shards))

    def rank_forward(rank):
        with torch.no_grad():
            return shards[rank](ids).last_hidden_state

    with summing_with(group.total):
        return group.run(rank_forward)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_shards_partial_results_sum_to_the_model(family):
    model, ids = _model(family), _ids()
    with torch.no_grad():
        want = model(ids).last_hidden_state
    shards = [shard_model(model, r, 2) for r in range(2)]
    attention = shards[1].layers[0].self_attn
    assert shards[1].config.num_attention_heads == 2 and shards[1].config.num_key_value_heads == 1
    assert attention.q_proj.weight.shape == (64, 128) and attention.o_proj.weight.shape == (128, 64)
    assert shards[1].layers[0].mlp.down_proj.weight.shape == (128, 128)
    torch.testing.assert_close(attention.k_proj.weight, model.layers[0].self_attn.k_proj.weight[32:])
    for got in _run_shards_in_torch(shards, ids):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_group_of_one_is_the_model_itself():
    model, ids = _model("llama"), _ids()
    (shard,) = [shard_model(model, 0, 1)]
    with torch.no_grad():
        torch.testing.assert_close(shard(ids).last_hidden_state, model(ids).last_hidden_state)
    assert "ccl.allreduce" not in from_torch(shard, (ids,)).script()


def test_shards_that_do_not_divide_are_refused_by_name():
    with pytest.raises(ValueError, match=r"num_attention_heads=4, num_key_value_heads=2.*3 ways"):
        shard_model(_model("llama"), 0, 3)
    with pytest.raises(ValueError, match="rank 2 is not in a group of 2"):
        shard_model(_model("llama"), 2, 2)


def test_a_model_outside_the_plans_family_is_refused():
    bert = transformers.BertModel(
        transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128)
    )
    with pytest.raises(TypeError, match="num_key_value_heads"):
        shard_model(bert, 0, 2)


def _allreduce_inputs(module: tvm.IRModule) -> list[str]:
    """For each all-reduce in main, what computes its input: an offloaded function's name, or the op."""
    bindings = {}
    for block in module["main"].body.blocks:
        for binding in block.bindings:
            bindings[binding.var] = binding.value
    producers = []
    for value in bindings.values():
        if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.ccl.allreduce":
            source = bindings.get(value.args[0])
            callee = source.args[0] if source is not None and source.args else None
            producers.append(str(getattr(callee, "global_symbol", getattr(source, "op", source))))
    return producers


@pytest.mark.parametrize("family, layers", [("llama", 2), pytest.param("qwen2", 1, marks=pytest.mark.slow)])
def test_tensor_parallel_ranks_run_together_on_the_cpu(family, layers):
    """Two ranks' offloaded modules, run at once with the all-reduce between them, give the model's
    output; an all-reduce follows each row-parallel projection, on its offloaded GEMM's output."""
    model, ids = _model(family, layers), _ids()
    with torch.no_grad():
        want = model(ids).last_hidden_state.numpy()
    build = offload_tensor_parallel(model, (ids,), 2, ARCH, compile=False)
    assert build.world_size == 2 and len(build.params[0]) == len(build.params[1]) > 0
    assert int(build.module["main"].attrs["num_input"]) == 1
    producers = _allreduce_inputs(build.module)
    assert len(producers) == 2 * layers, producers  # o_proj and down_proj of each layer
    assert all("matmul" in p and p.endswith("relax_cutlass") for p in producers), producers
    serve_regions_on_cpu(partition_for_cpu(from_torch(shard_model(model, 0, 2), (ids,)), ARCH))
    for got in run_ranks_on_cpu(build.module, build.params, [ids.numpy()]):
        assert rel_error(got, want) < 1e-2


def test_lifted_weights_run_as_the_bound_constants_did():
    model, ids = _model("llama", layers=1), _ids()
    partitioned, offloaded = offload_for_cpu(from_torch(model, (ids,)), arch=ARCH)
    lifted, weights = lift_weights(offloaded)
    assert len(lifted["main"].params) == 1 + len(weights) and int(lifted["main"].attrs["num_input"]) == 1
    assert not any(len(w.shape) == 0 for w in weights)
    serve_regions_on_cpu(partitioned)
    run = lambda mod, *extra: relax.VirtualMachine(tvm.compile(mod, CPU), tvm.cpu())["main"](  # noqa: E731
        *[tvm.runtime.tensor(a) for a in (ids.numpy(), *extra)]
    )
    first = lambda out: (out if hasattr(out, "numpy") else out[0]).numpy()  # noqa: E731
    np.testing.assert_array_equal(first(run(lifted, *weights)), first(run(offloaded)))


def test_a_group_of_one_runs_through_disco_on_the_cpu(tmp_path):
    """The disco path a GPU group takes (process session, the library loaded on the worker, the
    weights copied once, main called, worker 0's output back), as a group of one on the CPU."""
    model, ids = _model("llama", layers=1), _ids()
    with torch.no_grad():
        want = model(ids).last_hidden_state.numpy()
    build = offload_tensor_parallel(model, (ids,), 1, ARCH, compile=False)
    serve_regions_on_cpu(partition_for_cpu(from_torch(shard_model(model, 0, 1), (ids,)), ARCH))
    library = tmp_path / "group_of_one.so"
    tvm.compile(build.module, CPU).export_library(str(library))
    group = TensorParallelModule(str(library), build.params, device="cpu")
    try:
        assert rel_error(group(ids.numpy()), want) < 1e-2
        group.run_only(ids.numpy(), repeat=2)
    finally:
        group.shutdown()
    with pytest.raises(ValueError, match="a CPU group has one rank"):
        TensorParallelModule(str(library), [build.params[0]] * 2, device="cpu")


def test_the_nccl_backend_builds_from_the_wheels_source():
    """disco's NCCL backend, compiled from apache-tvm's shipped nccl.cc against the nvidia-nccl wheel,
    registers the functions `init_ccl("nccl", ...)` and the collectives dispatch to."""
    import tvm_ffi

    from relax_cutlass.parallel import find_nccl, load_nccl_backend

    try:
        find_nccl()
    except RuntimeError as err:
        pytest.skip(f"NCCL is not installed here: {err}")
    path = load_nccl_backend()
    assert path.exists()
    assert tvm_ffi.get_global_func("runtime.disco.compiled_ccl")() == "nccl"
    for name in ("init_ccl", "init_ccl_per_worker", "allreduce", "allgather", "broadcast_from_worker0", "sync_worker"):
        assert tvm_ffi.get_global_func(f"runtime.disco.nccl.{name}", allow_missing=True) is not None, name


def test_a_wrong_nccl_home_is_named(monkeypatch, tmp_path):
    from relax_cutlass.parallel import find_nccl

    monkeypatch.setenv("RELAX_CUTLASS_NCCL_HOME", str(tmp_path))
    with pytest.raises(SettingError, match=r"RELAX_CUTLASS_NCCL_HOME=.* has no include/nccl.h and no lib/libnccl.so.2"):
        find_nccl()


def test_a_packed_projection_the_plan_does_not_name_is_refused():
    """Phi-3 packs q|k|v and gate|up into one projection each: the plan's split would leave them whole
    while the config divides the heads, so the shard is refused by name, not built wrong."""
    config = transformers.Phi3Config(
        hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=1, vocab_size=512, pad_token_id=0, eos_token_id=1, bos_token_id=1,
    )  # fmt: skip
    with pytest.raises(TypeError, match=r"does not split Phi3Model .*qkv_proj\.weight \(256, 128\) where the shard"):
        shard_model(transformers.Phi3Model(config).eval(), 0, 2)
