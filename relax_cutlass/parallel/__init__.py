"""Tensor parallelism on the stock apache-tvm wheel: a model sharded over several GPUs with TVM's
disco, every rank running the offloaded CUTLASS kernels, NCCL between them.

    build = offload_tensor_parallel(model, (ids,), world_size=2, arch="sm_90a")
    tvm.compile(build.module, target).export_library("llama_tp2.so")
    model = TensorParallelModule("llama_tp2.so", build.params)
    out = model(ids.numpy())

`shard`: each rank's PyTorch module (Megatron-style column/row splits, an all-reduce after each
row-parallel projection); `build`: one offloaded module for all ranks, the weights lifted to
parameters; `nccl`: disco's NCCL backend, built from the source the wheel ships; `group`: the
disco process group that runs it.
"""

from .build import TensorParallelBuild, lift_weights, offload_tensor_parallel
from .group import TensorParallelModule, disco
from .nccl import find_nccl, load_nccl_backend, nccl_backend
from .shard import LLAMA_FAMILY, ShardPlan, shard_model

__all__ = [
    "LLAMA_FAMILY",
    "ShardPlan",
    "TensorParallelBuild",
    "TensorParallelModule",
    "disco",
    "find_nccl",
    "lift_weights",
    "load_nccl_backend",
    "nccl_backend",
    "offload_tensor_parallel",
    "shard_model",
]
