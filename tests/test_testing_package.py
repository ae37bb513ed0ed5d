"""relax_cutlass.testing as tests, benchmarks and scripts read it. The GPU tests skip at import on a
machine without a GPU, so a helper renamed in the testing package would otherwise surface only on
the GPU host: every `module.name` read off a testing module must be defined by that module."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTING = ROOT / "relax_cutlass" / "testing"
READERS = [ROOT / "tests", ROOT / "bench", ROOT / "scripts", TESTING]


def _module_path(dotted: str) -> Path | None:
    """The file of a relax_cutlass.testing module, or None for anything else."""
    parts = dotted.split(".")
    if parts[:2] != ["relax_cutlass", "testing"]:
        return None
    base = ROOT.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


@cache
def _top_level_names(path: Path) -> frozenset[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if path.name == "__init__.py":  # a package's submodules are its attributes too
        names |= {p.stem for p in path.parent.glob("*.py")} | {p.name for p in path.parent.iterdir() if p.is_dir()}
    return frozenset(names)


def _testing_aliases(tree: ast.AST, package: str) -> dict[str, Path]:
    """Local name -> testing module file, for each way a reader binds a testing module to a name."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for a in node.names:
                path = _module_path(f"{base}.{a.name}")
                if path:
                    aliases[a.asname or a.name] = path
        elif isinstance(node, ast.Import):
            aliases |= {a.asname: _module_path(a.name) for a in node.names if a.asname and _module_path(a.name)}
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "attr", "") == "importorskip"
            and node.value.args
            and isinstance(node.value.args[0], ast.Constant)
            and _module_path(str(node.value.args[0].value))
            and isinstance(node.targets[0], ast.Name)
        ):
            aliases[node.targets[0].id] = _module_path(node.value.args[0].value)
    return aliases


def test_every_name_read_off_a_testing_module_exists():
    missing, reads = [], 0
    for folder in READERS:
        for path in sorted(folder.rglob("*.py")):
            package = (
                "relax_cutlass.testing" + "".join("." + p for p in path.parent.relative_to(TESTING).parts)
                if path.is_relative_to(TESTING)
                else ""
            )
            tree = ast.parse(path.read_text())
            aliases = _testing_aliases(tree, package)
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                    reads += 1
                    if node.attr not in _top_level_names(aliases[node.value.id]):
                        missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert reads > 50, reads  # the scan sees the GPU tests' gpu_convs.*, the zoo's zoo.*, ...
    assert not missing, "\n".join(missing)


def test_the_scan_catches_a_missing_helper(tmp_path):
    tree = ast.parse("from relax_cutlass.testing import gpu_convs\ngpu_convs.relative_error(1, 2)\n")
    (alias,) = _testing_aliases(tree, "").items()
    assert alias[0] == "gpu_convs" and "relative_error" not in _top_level_names(alias[1])
    assert "cuda_target" in _top_level_names(alias[1])


def test_a_composite_build_is_reused_in_the_process_and_loaded_from_the_cache(tmp_path, monkeypatch):
    """testing.harness.build_composite_cpu: the same region twice is one build; a fresh process
    (the in-process table emptied) loads the shared library the first one wrote, which computes
    the same; a region that differs only in a constant is a build of its own."""
    import numpy as np
    import tvm
    from tvm import relax

    from relax_cutlass.testing import harness

    def region(scale: float) -> relax.Function:
        x = relax.Var("x", relax.TensorType((4, 8), "float32"))
        bb = relax.BlockBuilder()
        with bb.function("main", [x]):
            gv = bb.emit(relax.op.multiply(x, relax.const(scale, "float32")))
            bb.emit_func_output(gv)
        return bb.get()["main"]

    monkeypatch.setenv("RELAX_CUTLASS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(harness, "COMPOSITE_BUILDS", {})
    first, lock = harness.build_composite_cpu(region(2.0))
    assert harness.build_composite_cpu(region(2.0)) == (first, lock)
    (written,) = (tmp_path / "cpu-composites").glob("composite-*.so")
    harness.COMPOSITE_BUILDS.clear()
    loaded, _ = harness.build_composite_cpu(region(2.0))
    assert loaded is not first and list((tmp_path / "cpu-composites").iterdir()) == [written]
    x = np.arange(32, dtype="float32").reshape(4, 8)
    assert np.array_equal(loaded["main"](tvm.runtime.tensor(x)).numpy(), 2 * x)
    harness.build_composite_cpu(region(3.0))
    assert len(list((tmp_path / "cpu-composites").glob("composite-*.so"))) == 2
