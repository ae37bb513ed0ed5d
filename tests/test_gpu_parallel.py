"""Tensor parallelism on GPUs (relax_cutlass.parallel): a small Llama and Qwen2 sharded over 1 and 2
GPUs of this host with TVM's disco and the NCCL backend built from the TVM wheel's source, every
rank running the offloaded CUTLASS kernels, against the unsharded model in float64; the group of
two also as TVM's CUDA-graph build, the all-reduces captured in the graph. A failing disco worker
ends the whole process, so scripts/gpu_run.sh runs this file in a pytest of its own."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

import torch  # noqa: E402
import transformers  # noqa: E402
import tvm  # noqa: E402

from relax_cutlass.parallel import TensorParallelModule, offload_tensor_parallel  # noqa: E402
from relax_cutlass.testing import gpu_convs  # noqa: E402, F401  (skips this module without a GPU, torch or TVM's compiler)
from relax_cutlass.testing.errors import rel_error  # noqa: E402
from relax_cutlass.testing.gpu_convs import cuda_target  # noqa: E402


def _model(family: str):
    torch.manual_seed(0)
    common = dict(
        hidden_size=512, intermediate_size=1408, num_attention_heads=8, num_key_value_heads=4,
        num_hidden_layers=2, vocab_size=1024,
    )  # fmt: skip
    if family == "qwen2":
        return transformers.Qwen2Model(transformers.Qwen2Config(**common)).eval()
    return transformers.LlamaModel(transformers.LlamaConfig(**common)).eval()


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["plain", "cuda_graph"])
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_sharded_decoder_matches_the_model(family, world_size, cuda_graph, tmp_path):
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"{world_size} GPUs needed, {torch.cuda.device_count()} visible")
    model = _model(family)
    ids = torch.randint(0, 1024, (2, 128), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.double().cuda()(ids.cuda()).last_hidden_state.cpu().numpy()
    model.float().cpu()
    target = cuda_target()
    build = offload_tensor_parallel(model, (ids,), world_size, str(target.attrs["arch"]))
    library = tmp_path / f"{family}_tp{world_size}.so"
    with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": cuda_graph}):
        tvm.compile(build.module, target).export_library(str(library))
    group = TensorParallelModule(str(library), build.params)
    try:
        got = group(ids.numpy())
        group.run_only(ids.numpy(), repeat=3)  # a captured graph replays
        again = group(ids.numpy())
    finally:
        group.shutdown()
    assert rel_error(got, want) < 1e-2, rel_error(got, want)
    assert rel_error(again, got) == 0.0
