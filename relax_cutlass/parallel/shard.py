"""Megatron-style tensor-parallel shards of a PyTorch model, one module per rank, as MLC-LLM shards.

A rank holds 1/n of every attention head group and of the MLP's intermediate features: the
projections into them (q, k, v, gate, up) are split by output features (column-parallel), the
projections out of them (o, down) by input features (row-parallel), and each row-parallel
projection's output is followed by `tensor_parallel_sum`, the all-reduce that adds the ranks'
partial results. Everything else (embeddings, norms, the head) is replicated. Every rank's module
has the same graph, so one build serves all ranks with their own weights (`parallel.build`).
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from .collectives import tensor_parallel_sum

__all__ = ["LLAMA_FAMILY", "ShardPlan", "shard_model"]


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """Which submodules (by name suffix) a rank splits, and the config fields it divides."""

    column: tuple[str, ...]  # nn.Linear split by output features (weight rows, bias)
    row: tuple[str, ...]  # nn.Linear split by input features (weight columns; bias on rank 0), then summed
    divided: tuple[str, ...]  # config fields that count what the column-parallel layers split


# transformers' Llama, Mistral, Qwen2/3, Gemma/Gemma-2 and other models with these module names
LLAMA_FAMILY = ShardPlan(
    column=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
    row=("self_attn.o_proj", "mlp.down_proj"),
    divided=("num_attention_heads", "num_key_value_heads", "intermediate_size"),
)


def _role(name: str, plan: ShardPlan) -> str | None:
    module = name.rsplit(".", 1)[0]
    if any(module == s or module.endswith("." + s) for s in plan.column):
        return "column"
    if any(module == s or module.endswith("." + s) for s in plan.row):
        return "row"
    return None


def _split(name: str, tensor: torch.Tensor, role: str | None, rank: int, world_size: int) -> torch.Tensor:
    if role is None:
        return tensor
    if role == "column":
        return tensor.chunk(world_size, dim=0)[rank].clone()
    if name.endswith(".bias"):  # added once, after the sum
        return tensor.clone() if rank == 0 else torch.zeros_like(tensor)
    return tensor.chunk(world_size, dim=1)[rank].clone()


def shard_model(model: torch.nn.Module, rank: int, world_size: int, plan: ShardPlan = LLAMA_FAMILY) -> torch.nn.Module:
    """Rank `rank`'s module of `model` (a transformers model of the plan's family) split `world_size`
    ways; `model` is not changed. A group of one returns an unsplit copy with no collective."""
    if not 0 <= rank < world_size:
        raise ValueError(f"shard_model: rank {rank} is not in a group of {world_size}")
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"shard_model: {type(model).__name__} has no transformers config to shard by")
    missing = [f for f in plan.divided if getattr(config, f, None) is None]
    if missing:
        raise TypeError(
            f"shard_model: {type(model).__name__}'s config has no {', '.join(missing)}: not of this plan's family"
        )
    uneven = {f: getattr(config, f) for f in plan.divided if getattr(config, f) % world_size}
    if uneven:
        raise ValueError(
            f"shard_model: {', '.join(f'{k}={v}' for k, v in uneven.items())} cannot be split {world_size} ways; "
            f"use a group size that divides them"
        )
    roles = {name: _role(name, plan) for name in model.state_dict()}
    if world_size > 1 and not any(r == "row" for r in roles.values()):
        raise TypeError(f"shard_model: {type(model).__name__} has none of {plan.row}: not of this plan's family")
    sharded = copy.deepcopy(config)
    sharded.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for field in plan.divided:
        setattr(sharded, field, getattr(config, field) // world_size)
    with torch.device("meta"):
        shard = type(model)(sharded)
    state = {name: _split(name, t, roles[name], rank, world_size) for name, t in model.state_dict().items()}
    expected = shard.state_dict()
    wrong = [f"{n} {tuple(t.shape)} where the shard has {tuple(expected[n].shape)}" for n, t in state.items()
             if n in expected and t.shape != expected[n].shape]  # fmt: skip
    if wrong:
        raise TypeError(
            f"shard_model: the plan does not split {type(model).__name__} as its {world_size}-way config does: "
            f"{'; '.join(wrong[:3])}{' ...' if len(wrong) > 3 else ''} (a packed projection the plan does not "
            "name?); give a ShardPlan that covers these modules"
        )
    shard.load_state_dict(state, assign=True, strict=True)
    # buffers outside the state dict (rotary frequencies) are the same for every rank
    for name, buffer in model.named_buffers():
        if name not in state:
            owner, _, leaf = name.rpartition(".")
            shard.get_submodule(owner).register_buffer(leaf, buffer.clone(), persistent=False)
    if world_size > 1:
        for name, module in shard.named_modules():
            if _role(name + ".weight", plan) == "row":
                module.register_forward_hook(lambda _module, _args, out: tensor_parallel_sum(out))
    return shard.eval()
