"""launches_per_forward: the kernels one call of an offloaded module launches, relax_cutlass's and
TVM's, counted in the IR as tvm.compile's CUDA pipeline would fuse what stays in TVM; and the
offload report's line that shows them."""

from __future__ import annotations

import pytest

import relax_cutlass
from relax_cutlass.prepare import bind_weights
from relax_cutlass.testing.harness import partition_for_cpu
from relax_cutlass.testing.models import dense_epilogue_model, random_weights


def _dense_gelu():
    mod = dense_epilogue_model(64, 128, 256, activation="gelu")
    return bind_weights(mod, random_weights(mod))


def test_an_offloaded_region_is_one_launch_and_tvm_fuses_the_rest():
    mod = _dense_gelu()
    offloaded = relax_cutlass.offload_pipeline("sm_80", compile=False)(mod)
    assert relax_cutlass.launches_per_forward(offloaded) == {"relax_cutlass": 1, "tvm": 0, "other_externs": 0}
    # the same graph left to TVM: matmul, bias and GELU fused into one kernel of its own
    assert relax_cutlass.launches_per_forward(mod) == {"relax_cutlass": 0, "tvm": 1, "other_externs": 0}
    assert "[launches]  one call of main: 1 relax_cutlass kernel(s), 0 TVM kernel(s)" in str(
        relax_cutlass.offload_report(offloaded)
    )


def test_a_partitioned_module_is_refused_with_what_to_do():
    partitioned = partition_for_cpu(_dense_gelu(), "sm_80")
    with pytest.raises(ValueError, match="run the whole pipeline first"):
        relax_cutlass.launches_per_forward(partitioned)
    with pytest.raises(ValueError, match="no function 'forward'"):
        relax_cutlass.launches_per_forward(
            relax_cutlass.offload_pipeline("sm_80", compile=False)(_dense_gelu()), "forward"
        )
    assert relax_cutlass.offload_report(partitioned).launches is None


def test_a_densenet_launches_tvm_kernels_only_at_its_edges():
    """torchvision's DenseNet written out (two small blocks): every conv and every pre-activation
    norm is a relax_cutlass launch; TVM keeps 7 kernels, none between a block's layers: the input's
    cast and NHWC transpose, the stem's max pool, the transition's average pool, the final
    concatenation's float32 batch norm and the head's ReLU-mean pooling, flatten and output cast."""
    torch = pytest.importorskip("torch")
    from relax_cutlass.testing.models.torch_models import densenet

    model = densenet(growth=16, blocks=(3, 2), init_features=32, num_classes=10)
    mod = relax_cutlass.from_torch(model, (torch.randn(2, 3, 32, 32),), dtype="float16")
    offloaded = relax_cutlass.offload_pipeline("sm_90a", compile=False)(mod)
    report = relax_cutlass.offload_report(offloaded)
    launches = relax_cutlass.launches_per_forward(offloaded)
    assert launches == report.launches
    assert launches["relax_cutlass"] == sum(r["calls"] for r in report.offloaded) == 19
    assert launches["tvm"] == 7, str(report)
    assert relax_cutlass.launches_per_forward(mod)["tvm"] > 19  # TVM alone: a kernel per conv and more
