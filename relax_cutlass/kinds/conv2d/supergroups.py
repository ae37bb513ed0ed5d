"""Grouped convs with narrow groups (ResNeXt-50 32x4d: 4 to 32 output channels per group), merged
into super-groups at least one CTA tile (64 channels) wide: the filter becomes block-diagonal
within each super-group, once at build time, so the conv runs on CUTLASS's kSingleGroup kernels
(optimized iterators, full tiles) instead of kMultipleGroup ones (analytic iterators, a tile's
main loop rerun per group it spans, at 4 channels per group 1/16 of its MMA width on real data).

Measured on an H200 (batch 32, the ResNeXt-50 stage convs, 3x3, 32 groups; ms): 4 per group
1.183 -> 0.056 (cuDNN 0.045), 8: 0.226 -> 0.030 (0.033), 16: 0.061 -> 0.021 (0.024), 32: 0.027 ->
0.012 (0.016); the dense block-diagonal conv (one super-group) ran 0.07-0.08 on each.

Exact for finite activations: a super-group's extra filter columns are zeros, which add exact
zeros. An inf or NaN in another group's input channel would make it NaN (0 * inf), where torch
reads only the group's own channels: as for kMultipleGroup kernels (groups.py), whose main loop
reads past a group's channels too.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

from .channels import constant_filter_channels, conv_like

# Output channels a super-group spans at least: the narrowest CTA tile of the grouped kernels.
SUPER_GROUP_WIDTH = 64


def super_group_size(groups: int, k: int) -> int:
    """Groups merged into one super-group: the fewest whose output channels fill whole 64-wide
    tiles, or all of them (a dense conv) where `groups` is not a multiple of that; 1 where a group
    is already a multiple of 64 channels wide."""
    per_group = k // groups
    size = SUPER_GROUP_WIDTH // math.gcd(per_group, SUPER_GROUP_WIDTH)
    return size if groups % size == 0 else groups


def _merge(call: relax.Call) -> tuple[int, int] | None:
    """(groups, super-group size) of a grouped (not depthwise) conv2d of constant_filter_channels'
    kind whose groups are narrower than a tile; None for any other call."""
    channels = constant_filter_channels(call)
    if channels is None:
        return None
    c, k, groups = channels
    if groups == 1 or c % groups or k % groups or c == groups == k:
        return None
    size = super_group_size(groups, k)
    return (groups, size) if size > 1 else None


def block_diagonal(filters: np.ndarray, groups: int, size: int) -> np.ndarray:
    """(K, R, S, C/groups) grouped filters -> (K, R, S, size * C/groups): each output channel keeps
    its own group's columns at its group's place within its super-group of `size` groups, zeros
    elsewhere."""
    k, r, s, per_group = filters.shape
    k_per_group = k // groups
    merged = np.zeros((k, r, s, size * per_group), filters.dtype)
    for group in range(groups):
        rows = slice(group * k_per_group, (group + 1) * k_per_group)
        place = group % size
        merged[rows, :, :, place * per_group : (place + 1) * per_group] = filters[rows]
    return merged


@relax.expr_functor.mutator
class _MergeGroups(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        merge = _merge(call)
        if merge is None:
            return call
        groups, size = merge
        data, weight = call.args
        filters = weight.value.numpy()
        merged = relax.const(block_diagonal(filters, groups, size), str(filters.dtype))
        return conv_like(call, data, merged, groups // size)


def merge_narrow_groups(func: relax.Function) -> relax.Function:
    """conv2d(x, w, groups=G) with fewer than 64 output channels per group -> conv2d(x, w',
    groups=G/s), w' block-diagonal over super-groups of s groups (super_group_size). Only constant
    filters (bound weights: the expansion happens once, here); a filter given at run time keeps its
    groups (and the kMultipleGroup kernels)."""
    if not any(
        isinstance(b.value, relax.Call) and _merge(b.value) for block in func.body.blocks for b in block.bindings
    ):
        return func
    return _MergeGroups().visit_expr(func)
