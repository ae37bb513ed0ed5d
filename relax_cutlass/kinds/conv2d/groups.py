"""Grouped conv2d (1 < groups, not depthwise) on CUTLASS 2.x's grouped fprop kernels
(`DefaultConv2dGroupFprop`, examples/42_ampere_tensorop_group_conv), and what they require.

CUTLASS runs a grouped conv as the ungrouped implicit GEMM, with each CTA's A tile (activations)
read from the input channels of one group at a time, so a CTA's N tile (output channels) must lie
within one group or span whole groups:

  * kSingleGroup: K/groups is a multiple of the CTA tile's N, each CTA computes part of one group
    (optimized or analytic iterators);
  * kMultipleGroup: the CTA tile's N is a multiple of K/groups, each CTA runs its main loop once
    per group it spans, on that group's channels (analytic iterators only).

Activations and filters are read group by group, so their vector width must divide C/groups (the
iterators' `can_implement`), the output's must divide K. `ImplicitGemmConvolution::can_implement`
refuses split-K with groups, and there is no grouped `DefaultConv2dFpropWithBroadcast`, so no fused
residual. A tile's main loop covers C/groups rounded up to its K tile: the channels past a group's
end are read from the next group's (or zero-filled past C) and meet zero-filled filter columns, which
adds exact zeros for finite activations (an inf or NaN in the next group would make them NaN, where
torch reads only the group's own channels).

Plain arithmetic (no TVM, no cutlass_library): the records, the rules and the kernel choice share it.
"""

from __future__ import annotations

from collections.abc import Iterable

# Conv2dFpropActivationTileAccessIteratorOptimized keeps one mask bit per filter row and column.
MAX_OPTIMIZED_FILTER = 32

NO_GROUPED_RESIDUAL = (
    "grouped conv2d with a residual add: CUTLASS has no grouped fprop kernel with the residual-block "
    "epilogue (DefaultConv2dFpropWithBroadcast takes no group mode); the add stays in TVM"
)


def group_mode(groups: int, k: int, tile_n: int) -> str | None:
    """The cutlass::conv::GroupMode a CTA tile `tile_n` output channels wide runs a conv of `groups`
    groups of K/groups output channels in: "none" (groups == 1), "single" (K/groups a multiple of
    tile_n; preferred where both hold: it has optimized iterators), "multiple" (tile_n a multiple
    of K/groups), or None where the tile would straddle a group boundary."""
    if groups == 1:
        return "none"
    per_group = k // groups
    if per_group % tile_n == 0:
        return "single"
    if tile_n % per_group == 0:
        return "multiple"
    return None


def iterator_for(mode: str, r: int, s: int) -> str:
    """cutlass::conv::IteratorAlgorithm: the optimized iterators where the kernel has them (every
    mode but kMultipleGroup) and the filter fits their masks, else the analytic ones."""
    return "analytic" if mode == "multiple" or max(r, s) > MAX_OPTIMIZED_FILTER else "optimized"


def grouped_conv_problems(c: int, k: int, groups: int, tile_widths: Iterable[int]) -> list[str]:
    """Why a conv2d of `groups` > 1 groups cannot run as a CUTLASS grouped fprop kernel, whose CTA
    tiles are `tile_widths` output channels wide (cutlass_library's list); empty when it can."""
    if c == groups == k:
        return ["a depthwise conv2d (groups == C == K): the depthwise kind's"]
    if c % groups or k % groups:
        return [f"C={c} and K={k} must be multiples of groups={groups}"]
    problems = []
    per_group, k_per_group = c // groups, k // groups
    if per_group % 2 or k % 2:
        problems.append(
            f"C/groups={per_group} input channels per group and K={k} must both be even (the grouped "
            "kernels read each group's channels, and write the output, in vectors of 2, 4 or 8 16-bit elements)"
        )
    widths = sorted(set(tile_widths))
    if not any(group_mode(groups, k, n) for n in widths):
        problems.append(
            f"K/groups={k_per_group} output channels per group: CUTLASS's grouped kernels need a CTA tile N "
            f"(one of {widths}) that is a multiple of it (several groups per CTA) or that divides it (one "
            "group per CTA)"
        )
    return problems


def grouped_epilogue_problems(groups: int, residual: bool) -> list[str]:
    """Why the epilogue cannot be fused into a grouped kernel (empty when it can)."""
    return [NO_GROUPED_RESIDUAL] if groups > 1 and residual else []


def grouped_kernel_problems(groups: int, k: int, tile_n: int, residual: bool) -> list[str]:
    """Why a kernel with a CTA tile `tile_n` wide (and a residual epilogue, if `residual`) cannot
    run a conv of `groups` groups of K output channels (empty when it can, or when groups == 1)."""
    problems = grouped_epilogue_problems(groups, residual)
    if group_mode(groups, k, tile_n) is None:
        problems.append(f"a CTA tile {tile_n} wide straddles the groups of K/groups={k // groups} output channels")
    return problems
