"""Following view ops (reshape, permute_dims, broadcast_to) through a region, naming the logical
attention axis each dimension holds."""

from __future__ import annotations

import math
from collections.abc import Iterator

import tvm
from tvm import relax

# A layout: for each dimension of a tensor, the logical axes merged into it, outermost first.
# Axes of static size 1 are left out (they place nothing in memory).
Layout = tuple[tuple[str, ...], ...]


class NotAttention(Exception):
    """A view the kernel cannot express; the message says which and why."""


def known_dims(expr: relax.Expr) -> list | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    shape = ty.shape
    if isinstance(shape, relax.Var) and isinstance(shape.ty, relax.ShapeType):
        # a symbolic shape lifted into a region is a Shape parameter (broadcast_to(x, param_0)):
        # its type still holds the dims
        shape = shape.ty
    values = getattr(shape, "values", None)
    return None if values is None else list(values)


def expr_dims(expr: relax.Expr) -> list:
    dims = known_dims(expr)
    if dims is None:
        raise NotAttention(f"{expr_name(expr)} has no known shape")
    return dims


def expr_name(expr: relax.Expr) -> str:
    return expr.name if isinstance(expr, relax.Var) else type(expr).__name__


def is_one(dim) -> bool:
    return isinstance(dim, tvm.tirx.IntImm) and int(dim) == 1


def static_dim(dim) -> int | None:
    return int(dim) if isinstance(dim, (int, tvm.tirx.IntImm)) else None


def is_op_call(expr: relax.Expr, op: str) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == op


def softmax_adds(var2val) -> Iterator[tuple[relax.Var, relax.Var, relax.Call]]:
    """(the softmax's var, x, its add) for each softmax(x) whose input x is a var bound to an add:
    where the mask rewrites find the scores and what is added to them."""
    for var, value in var2val.items():
        if not is_op_call(value, "relax.nn.softmax") or not isinstance(value.args[0], relax.Var):
            continue
        add = var2val.get(value.args[0])
        if is_op_call(add, "relax.add"):
            yield var, value.args[0], add


class Tracer:
    """Follows views from one tensor to another, keeping each dimension's logical axes."""

    def __init__(self, var2val, sizes: dict[str, tvm.tirx.PrimExpr], sides: tuple[relax.Expr, ...] = ()):
        self.var2val = var2val
        self.sizes = sizes
        # what is added to the scores (a bias, a region input; a causal mask): an add continues
        # past it, through its other argument
        self.sides = sides
        self.children: dict[str, tuple[str, str]] = {}  # axis -> its two sub-axes, once split
        # Axes a broadcast_to made by repeating data (grouped-query keys/values): axis -> the
        # times each element repeats. Only while `repeats_allowed` (the k/v of a "softmax_gqa" match).
        self.repeats: dict[str, int] = {}
        self.repeats_allowed = False
        # Parameter axes a strided_slice cut (q, k and v out of one packed projection): axis ->
        # (first element, the axis's whole size); its part is the axis's one child.
        self.slices: dict[str, tuple[int, int]] = {}
        self.analyzer = tvm.sym.Analyzer()

    def equal(self, a, b) -> bool:
        return self.analyzer.can_prove_equal(a, b)

    def label(self, expr: relax.Expr, names: tuple[str, ...]) -> Layout:
        """The layout of `expr` itself, its dimensions named `names`."""
        dims = expr_dims(expr)
        if len(dims) != len(names):
            raise NotAttention(f"{expr_name(expr)} has rank {len(dims)}, not {len(names)}")
        for name, dim in zip(names, dims, strict=True):
            if name in self.sizes and not self.equal(self.sizes[name], dim):
                raise NotAttention(f"{expr_name(expr)}'s {name} size {dim} differs from {self.sizes[name]}")
            self.sizes[name] = dim
        return tuple(() if is_one(d) else (n,) for n, d in zip(names, dims, strict=True))

    def chain(self, end: relax.Expr, start: relax.Expr, allowed: tuple[str, ...]) -> list[relax.Call]:
        """The calls from `start` to `end`, first first; every one an op in `allowed` whose
        main argument (`main_arg`) continues the chain."""
        calls = []
        expr = end
        while not expr.same_as(start):
            value = self.value(expr)
            if value.same_as(start):  # a matched wildcard is the bound value, not the var
                break
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in allowed):
                raise NotAttention(f"{expr_name(expr)} is not reached from {expr_name(start)} through {allowed}")
            calls.append(value)
            expr = self.main_arg(value)
        return calls[::-1]

    def value(self, expr: relax.Expr) -> relax.Expr:
        """What a dataflow var is bound to (the expression itself otherwise)."""
        return self.var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def is_side(self, expr: relax.Expr) -> bool:
        """`expr` is one of the terms added to the scores (`sides`), or the cast of one."""
        value = self.value(expr)
        if any(expr.same_as(side) or value.same_as(side) for side in self.sides):
            return True
        return is_op_call(value, "relax.astype") and self.is_side(value.args[0])

    def scalar_const(self, expr: relax.Expr) -> tuple[tvm.ir.GenericConst, relax.Call | None] | None:
        """(constant, its cast or None) when `expr` is a scalar constant, possibly cast."""
        value = self.value(expr)
        cast = None
        if is_op_call(value, "relax.astype"):
            cast, value = value, self.value(value.args[0])
        if isinstance(value, tvm.ir.GenericConst) and value.value.numpy().size == 1:
            return value, cast
        return None

    def main_arg(self, call: relax.Call) -> relax.Expr:
        """The argument a chain of views/elementwise ops continues through: the probabilities of
        the safe-softmax `where`, the scores of the bias add, the tensor a scale multiplies."""
        op = call.op.name
        if op == "relax.where":
            return call.args[2]
        if op == "relax.add":
            return call.args[1] if self.is_side(call.args[0]) else call.args[0]
        if op in ("relax.multiply", "relax.divide"):
            return call.args[1] if self.scalar_const(call.args[0]) is not None else call.args[0]
        return call.args[0]

    def apply(self, layout: Layout, call: relax.Call) -> Layout:
        op = call.op.name
        if op == "relax.permute_dims":
            axes = call.attrs.axes
            order = [int(a) for a in axes] if axes is not None else list(range(len(layout)))[::-1]
            return tuple(layout[a] for a in order)
        if op == "relax.reshape":
            return self.regroup(layout, expr_dims(call), call)
        if op == "relax.expand_dims":
            rank = len(layout) + len(call.attrs.axis)
            new = sorted(int(a) % rank for a in call.attrs.axis)
            rest = iter(layout)
            return tuple(() if i in new else next(rest) for i in range(rank))
        if op == "relax.broadcast_to":
            return self.broadcast(layout, expr_dims(call.args[0]), expr_dims(call))
        if op == "relax.strided_slice":
            return self.slice(layout, call)
        return layout  # elementwise: astype, the scale, softmax (its axis is checked apart)

    def broadcast(self, layout: Layout, before: list, after: list) -> Layout:
        """A broadcast_to: a no-op one, or (`repeats_allowed`) one that repeats a unit dimension
        G times, which becomes a new axis held in `repeats` (read with stride 0)."""
        if len(before) != len(after):
            raise NotAttention(f"broadcast_to {[str(d) for d in after]} adds dimensions")
        out = list(layout)
        for i, (a, b) in enumerate(zip(before, after, strict=True)):
            if self.equal(a, b):
                continue
            times = static_dim(b)
            if not (self.repeats_allowed and is_one(a) and times is not None and not layout[i]):
                raise NotAttention(f"broadcast_to {[str(d) for d in after]} repeats data (only a no-op one is fused)")
            axis = f"repeat{len(self.repeats)}"
            self.sizes[axis] = tvm.tirx.IntImm("int64", times)
            self.repeats[axis] = times
            out[i] = (axis,)
        return tuple(out)

    def slice(self, layout: Layout, call: relax.Call) -> Layout:
        """A strided_slice of one whole, static axis of the tensor (the part of a packed q/k/v
        projection an operand is): the axis becomes its part, read at an offset (`slices`)."""
        axes, begin, end = (list(call.args[i]) if len(call.args) > i else [] for i in (1, 2, 3))
        strides = list(call.args[4]) if len(call.args) > 4 else []
        if len(axes) != 1 or any(static_dim(v) != 1 for v in strides):
            raise NotAttention("a strided_slice of more than one axis, or with steps, is not fused")
        dim = static_dim(axes[0]) % len(layout)
        lo, hi = static_dim(begin[0]), static_dim(end[0])
        group = layout[dim]
        if len(group) != 1 or group[0] in self.children or lo is None or hi is None:
            raise NotAttention("a strided_slice of a merged, split or symbolic axis is not fused")
        axis = group[0]
        whole = static_dim(self.sizes[axis])
        if whole is None or not 0 <= lo < hi <= whole:
            raise NotAttention(f"strided_slice [{lo}:{hi}] of axis {axis} is out of its static range")
        part = f"{axis}.slice"
        self.sizes[part] = tvm.tirx.IntImm("int64", hi - lo)
        self.children[axis] = (part,)
        self.slices[axis] = (lo, whole)
        return (*layout[:dim], (part,), *layout[dim + 1 :])

    def regroup(self, layout: Layout, new_dims: list, call) -> Layout:
        """A reshape: the same axes in the same order, grouped into the new dimensions. A static
        axis may be split (the head split of a (B, S, N*H) projection): it becomes two sub-axes."""
        axes = [a for group in layout for a in group]
        groups, i = [], 0
        for dim in new_dims:
            if is_one(dim):
                groups.append(())
                continue
            group: list[str] = []
            size = tvm.tirx.IntImm("int64", 1)
            while not (group and self.equal(size, dim)):
                if i == len(axes):
                    raise NotAttention(f"reshape to {[str(d) for d in new_dims]} does not regroup the axes")
                axis = axes[i]
                outer = self._split_off(axis, size, dim)
                if outer is not None:
                    axes[i : i + 1] = list(outer)
                    axis = axes[i]
                group.append(axis)
                size = size * self.sizes[axis]
                i += 1
            groups.append(tuple(group))
        if i != len(axes):
            raise NotAttention(f"reshape to {[str(d) for d in new_dims]} drops axes")
        return tuple(groups)

    def _split_off(self, axis: str, size, dim) -> tuple[str, str] | None:
        """If `axis` is larger than what dimension `dim` still needs after `size`, split it into
        (that much, the rest) and return the two sub-axes; None when it fits whole."""
        whole, need, have = (static_dim(e) for e in (self.sizes[axis], dim, size))
        if None in (whole, need, have) or need % have or whole <= need // have:
            return None
        outer = need // have
        if whole % outer:
            raise NotAttention(f"reshape to {dim} cuts axis {axis} of size {whole} unevenly")
        parts = (f"{axis}.0", f"{axis}.1")
        self.sizes[parts[0]] = tvm.tirx.IntImm("int64", outer)
        self.sizes[parts[1]] = tvm.tirx.IntImm("int64", whole // outer)
        self.children[axis] = parts
        return parts

    def leaves(self, axis: str) -> list[str]:
        """`axis`, or the sub-axes it was split into, outermost first."""
        return [leaf for part in self.children.get(axis, ()) for leaf in self.leaves(part)] or [axis]

    def read(self, names: list[str], axis: str) -> tuple[int, int]:
        """(dimension of the parameter, element factor within it) of a leaf axis: its stride is
        the dimension's packed stride times the sizes of the leaves inside it after this one."""
        for dim, root in enumerate(names):
            leaves = self.leaves(root)
            if axis in leaves:
                inner = leaves[leaves.index(axis) + 1 :]
                return dim, math.prod(static_dim(self.sizes[a]) for a in inner)
        raise NotAttention(f"axis {axis} belongs to no parameter dimension")

    def follow(self, layout: Layout, calls: list[relax.Call]) -> Layout:
        for call in calls:
            layout = self.apply(layout, call)
        return layout
