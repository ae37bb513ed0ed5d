"""The patterns of the depthwise conv2d kind (NHWC x OHWI conv2d with groups == C == K, + bias,
activation), its legality rules, how a matched region reads back into a DepthwiseProblem, and the
report row of a depthwise conv2d left in TVM."""

from __future__ import annotations

from dataclasses import dataclass

from tvm import relax

from .. import CODEGEN
from ..conv2d.patterns import conv2d_pattern
from ..epilogue_patterns import EpilogueSpec, dtype_of, epilogue_problems, epilogue_specs, shape_dims, static_int
from ..ir import is_depthwise
from ..nhwc import conv_flops, conv_geometry_of, layout_problem
from .records import MAX_GRID_Z, DepthwiseProblem
from .select import direct_problems, tile_for

# Filter sizes compiled (one kernel per size): what depthwise nets use (MobileNet 3x3/5x5,
# ConvNeXt 7x7). Larger filters exceed the kernel's registers.
MAX_FILTER = 7


@dataclass(frozen=True)
class DepthwisePatternSpec(EpilogueSpec):
    """One depthwise composite: conv2d root, then bias, activation (no residual: the direct
    convolution's epilogue reads one source tensor, the bias)."""

    bias: bool = False
    activation: str = "identity"
    residual: bool = False
    residual_relu: bool = False
    cast: bool = False

    @property
    def name(self) -> str:
        return f"{CODEGEN}." + "_".join(["dwconv2d", *self.epilogue.parts()])

    @property
    def size(self) -> int:
        return 1 + self.bias + (self.activation != "identity") * 2


def all_depthwise_specs() -> list[DepthwisePatternSpec]:
    return [s for s in epilogue_specs(DepthwisePatternSpec) if not s.residual]


# The conv2d root + epilogue pattern, built from this kind's specs (the rules tell the kinds apart).
depthwise_pattern = conv2d_pattern


def depthwise_problems(conv: relax.Call, layout_skipped: str | None = None) -> list[str]:
    """Why this depthwise R.nn.conv2d can run on neither kernel family (empty when one takes it)."""
    if why := layout_problem(conv, layout_skipped):
        return [why]
    data, weight = conv.args
    problems = []
    dtypes = {dtype_of(data), dtype_of(weight), dtype_of(conv)}
    if len(dtypes) != 1 or not dtypes <= {"float16", "bfloat16"}:
        problems.append(
            f"data/weight/output dtypes {dtype_of(data)}/{dtype_of(weight)}/{dtype_of(conv)}: the depthwise "
            "kernels take float16 (and bfloat16 on the blocked direct kernel), all three the same"
        )
    static = [static_int(d) for d in (*shape_dims(data)[1:], *shape_dims(weight), *shape_dims(conv)[1:])]
    if None in static:
        return [*problems, "H, W, C and the filter shape must be static; only the batch N may be symbolic"]
    c, r, s = static[2], static[4], static[5]
    if c % 8:
        problems.append(f"C={c} must be a multiple of 8 (the kernel's 128-bit channel accesses)")
    if r > MAX_FILTER or s > MAX_FILTER:
        problems.append(f"a {r}x{s} filter is larger than the {MAX_FILTER}x{MAX_FILTER} the kernels are built for")
    if problems:
        return problems
    problem = DepthwiseProblem(**conv_geometry_of({"data": data, "weight": weight, "root": conv}))
    if not (uncovered := direct_problems(problem)):
        return []  # the blocked direct kernel: any batch (its grid holds every tile)
    if problem.element != "float16":
        return [f"{problem.element} runs only on the blocked direct kernel, which does not take this conv: "
                + "; ".join(uncovered)]  # fmt: skip
    n = static_int(shape_dims(data)[0])
    if n is not None:
        tile = tile_for(problem)
        tiles = tile.tiles(problem, n)
        if tile.one_tile_per_cta(problem) and tiles > MAX_GRID_Z:
            problems.append(
                f"batch {n} gives {tiles} output tiles per channel group, more than the "
                f"{MAX_GRID_Z} threadblocks CUTLASS's direct convolution (one tile each) can launch; split the batch"
            )
    return problems


def depthwise_rules(spec, ann, out, _var2val) -> list[str]:
    root = ann["root"]
    if not is_depthwise(root):
        return ["not a depthwise conv2d (groups == C == K)"]
    return depthwise_problems(root) or epilogue_problems(spec, ann, out)


def read_problem(spec, ann, out_expr, _var2val, _accumulator: str) -> DepthwiseProblem:
    return DepthwiseProblem(**conv_geometry_of(ann))  # sums in float32 whatever is asked


def left_in_tvm_row(call: relax.Call, _var2val, layout_skipped: str | None) -> tuple | None:
    """(op, FLOPs, reasons) of a depthwise conv2d left in TVM; None for any other conv2d (the
    conv2d kind reports those)."""
    if not is_depthwise(call):
        return None
    return "dwconv2d", conv_flops(call), depthwise_problems(call, layout_skipped)
