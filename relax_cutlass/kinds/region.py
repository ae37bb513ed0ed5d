"""What every kind's region record shares, and the report line of GEMM-like (M, N, K) rows."""

from __future__ import annotations

from dataclasses import dataclass

from ..arch import arch_name


@dataclass(frozen=True)
class Region:
    """One offloaded function: its external symbol, kernel, and the role of each runtime argument."""

    symbol: str
    kernel: object  # the kind's kernel record
    # Role of each function parameter, in order: "lhs"/"rhs" or "data"/"weight", "bias", "residual".
    arg_roles: tuple[str, ...]
    # Shapes as written in the IR (ints, or names of symbolic dims), for checks and the report.
    arg_shapes: tuple[tuple[int | str, ...], ...]
    arg_dtypes: tuple[str, ...]
    out_shape: tuple[int | str, ...]
    out_dtype: str
    composite: str
    # (role, role of the parameter that also plays it): one tensor in two roles, as the residual of
    # y = act(x @ w + b) + x is the lhs.
    role_aliases: tuple[tuple[str, str], ...] = ()
    # Every output in DPS order (after the parameters) as (role, shape, dtype), where the region
    # returns a tuple (RegionKind.extra_outputs); empty: one output, "out" (out_shape, out_dtype).
    outputs: tuple[tuple[str, tuple[int | str, ...], str], ...] = ()

    @property
    def output_list(self) -> tuple[tuple[str, tuple[int | str, ...], str], ...]:
        """(role, shape, dtype) of each output in DPS order; the main one is "out"."""
        return self.outputs or (("out", self.out_shape, self.out_dtype),)

    @property
    def roles(self) -> set[str]:
        """Every role some parameter plays."""
        return set(self.arg_roles) | {alias for alias, _ in self.role_aliases}

    def _row(self, op: str, mnk: list, details: dict) -> dict:
        """The report row: what every region reports, with `details` before the kernel columns."""
        return {
            "symbol": self.symbol,
            "op": op,
            "composite": self.composite,
            "epilogue": self.kernel.epilogue.describe(),
            "shapes": {r: list(s) for r, s in zip(self.arg_roles, self.arg_shapes, strict=True)},
            "out_shape": list(self.out_shape),
            **({"outputs": {r: list(s) for r, s, _ in self.outputs}} if self.outputs else {}),
            "dtypes": {r: d for r, d in zip(self.arg_roles, self.arg_dtypes, strict=True)}
            | {"out": self.out_dtype, "accumulator": self.kernel.problem.element_accumulator},
            "mnk": mnk,
            **details,
            "kernel": self.kernel.name,
            # the kernel family ("sm80": CUTLASS 2.x mma.sync, "sm90": 3.x wgmma) and the SASS it is built as
            "family": f"sm{self.kernel.arch}",
            "target": arch_name(self.kernel.target),
            "selected_by": self.kernel.selected_by,
            "note": self.kernel.note,  # why this family, where the target's own is not it
        }


def calls_suffix(r: dict) -> str:
    """The report line's count of calls of an offloaded function called more than once."""
    return f" x{r['calls']} calls" if r.get("calls", 1) > 1 else ""


def mnk_report_line(r: dict, detail: str = "") -> str:
    """The report line of an offloaded region described by its GEMM (M, N, K)."""
    m, n, k = r["mnk"]
    dtypes = r["dtypes"]
    return (
        f"  [offloaded] {r['op']:6s} M={m} N={n} K={k}{detail} epilogue={r['epilogue']} "
        f"{dtypes.get('lhs', dtypes.get('data'))}->{dtypes['out']} (acc {dtypes['accumulator']}) "
        f"kernel={r['kernel']} ({r['selected_by']}{'; ' + r['note'] if r.get('note') else ''})" + calls_suffix(r)
    )
