"""One offloaded module for every rank of a tensor-parallel group, each rank with its own weights.

Each rank's shard (`parallel.shard`) is imported with `from_torch` and offloaded as any model is
(so every rewrite that needs constant weights still applies: q|k|v fused, gated MLPs split, casts
and transposes folded); then `lift_weights` turns main's tensor constants into trailing parameters
of main, in the order they first appear. The ranks' modules then differ only in those values, which
is checked, and rank 0's is the one built: `TensorParallelBuild.params[r]` are rank r's weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ..frontend import from_torch
from ..kinds.ir import ConstantsToParams
from ..pipeline import offload_pipeline
from .shard import LLAMA_FAMILY, ShardPlan, shard_model

__all__ = ["TensorParallelBuild", "lift_weights", "offload_tensor_parallel"]


def lift_weights(mod: tvm.IRModule, func_name: str = "main") -> tuple[tvm.IRModule, list[np.ndarray]]:
    """`func_name`'s tensor constants (not scalars) as parameters after its own (its `num_input` attribute keeps
    the count of the inputs proper, as TVM's params convention has it) -> (module, their values)."""
    func = mod[func_name]
    lifter = ConstantsToParams(mod, name=lambda index, _const: f"weight{index}")
    body = lifter.visit_expr(func.body)
    inputs = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else len(func.params)
    params = [*func.params, *(var for var, _ in lifter.lifted)]
    lifted = relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs).with_attr("num_input", inputs)
    functions = {gv: (lifted if gv.name_hint == func_name else f) for gv, f in mod.functions_items()}
    return tvm.IRModule(functions, attrs=mod.attrs), [const.value.numpy() for _, const in lifter.lifted]


@dataclasses.dataclass
class TensorParallelBuild:
    """The module every rank runs (offloaded, weights as main's trailing parameters) and each rank's
    weights, rank by rank."""

    module: tvm.IRModule
    params: list[list[np.ndarray]]

    @property
    def world_size(self) -> int:
        return len(self.params)


def offload_tensor_parallel(
    model,
    example_inputs: Any,
    world_size: int,
    arch: str = "auto",
    dtype: str = "float16",
    *,
    plan: ShardPlan = LLAMA_FAMILY,
    example_kwargs: Mapping[str, Any] | None = None,
    **options,
) -> TensorParallelBuild:
    """Shard `model` `world_size` ways, import and offload each rank's module (`options` as
    `offload_pipeline`'s; kernels compiled for rank 0's, the others' only planned: the same kernels),
    and lift the weights. Raises if a rank's module differs from rank 0's other than in weights."""
    if world_size < 1:
        raise ValueError(f"offload_tensor_parallel: world_size={world_size!r}: use a whole number >= 1")
    module, params = None, []
    for rank in range(world_size):
        shard = shard_model(model, rank, world_size, plan)
        imported = from_torch(shard, example_inputs, dtype, example_kwargs=example_kwargs)
        offloaded = offload_pipeline(arch, **(options if rank == 0 else {**options, "compile": False}))(imported)
        lifted, weights = lift_weights(offloaded)
        if module is None:
            module = lifted
        elif not tvm_ffi.structural_equal(lifted["main"], module["main"], map_free_vars=True):
            raise RuntimeError(
                f"offload_tensor_parallel: rank {rank}'s module differs from rank 0's beyond its weights, so one "
                "build cannot serve both; a rewrite depended on weight values (please report it)"
            )
        params.append(weights)
    return TensorParallelBuild(module, params)
