"""The package's layers point down only (docs/architecture.md): the toolkit knows no region kind and
no pass, the kinds know no pass, and no module imports another's underscore names. Read from the
source (every import, function-local ones too), so a new upward import fails here, not in a cycle
at import time."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "relax_cutlass"

# layer -> the packages of relax_cutlass it must not import (anything above it)
ABOVE = {
    "relax_cutlass.toolkit": (
        "relax_cutlass.kinds", "relax_cutlass.stages", "relax_cutlass.rewrites", "relax_cutlass.pipeline",
        "relax_cutlass.transform", "relax_cutlass.frontend", "relax_cutlass.extend", "relax_cutlass.tune",
        "relax_cutlass.prepare", "relax_cutlass.onnx_frontend", "relax_cutlass.testing", "relax_cutlass.parallel",
    ),
    "relax_cutlass.kinds": (
        "relax_cutlass.stages", "relax_cutlass.rewrites", "relax_cutlass.pipeline", "relax_cutlass.transform",
        "relax_cutlass.frontend", "relax_cutlass.extend", "relax_cutlass.tune", "relax_cutlass.prepare",
        "relax_cutlass.onnx_frontend", "relax_cutlass.testing", "relax_cutlass.parallel",
    ),
    "relax_cutlass.stages": (
        "relax_cutlass.pipeline", "relax_cutlass.transform", "relax_cutlass.frontend", "relax_cutlass.extend",
        "relax_cutlass.tune", "relax_cutlass.prepare", "relax_cutlass.onnx_frontend", "relax_cutlass.testing",
        "relax_cutlass.parallel",
    ),
    "relax_cutlass.rewrites": (
        "relax_cutlass.stages", "relax_cutlass.pipeline", "relax_cutlass.transform", "relax_cutlass.frontend",
        "relax_cutlass.extend", "relax_cutlass.tune", "relax_cutlass.prepare", "relax_cutlass.onnx_frontend",
        "relax_cutlass.testing", "relax_cutlass.parallel",
    ),
}  # fmt: skip


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(local_only: bool = False) -> list[tuple[str, str, list[str], int]]:
    """(module, imported module, imported names, line) for every import in the package (`local_only`:
    those inside a function)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module(path)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text())
        top = set(tree.body)
        for node in ast.walk(tree):
            if local_only and node in top:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found.append((module, target, [a.name for a in node.names], node.lineno))
            elif isinstance(node, ast.Import):
                found += [(module, a.name, [], node.lineno) for a in node.names]
    return found


def test_the_scan_sees_the_package():
    edges = imports()
    assert len(edges) > 300
    assert any(m.startswith("relax_cutlass.stages") and t.startswith("relax_cutlass.kinds") for m, t, _, _ in edges)


@pytest.mark.parametrize("layer", sorted(ABOVE))
def test_a_layer_imports_nothing_above_it(layer):
    upward = [
        f"{module}:{line} imports {target}"
        for module, target, _, line in imports()
        if (module == layer or module.startswith(layer + "."))
        and any(target == above or target.startswith(above + ".") for above in ABOVE[layer])
    ]
    assert not upward, "\n".join(upward)


def test_no_module_imports_another_modules_underscore_names():
    private = [
        f"{module}:{line} imports {name} from {target}"
        for module, target, names, line in imports()
        if target.startswith("relax_cutlass")
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not private, "\n".join(private)


@pytest.mark.parametrize("layer", sorted(ABOVE))
def test_a_layer_imports_the_package_at_module_level(layer):
    """A function-local import of the package is how a cycle hides; the layers have none."""
    local = [
        f"{module}:{line} imports {target} inside a function"
        for module, target, _, line in imports(local_only=True)
        if (module == layer or module.startswith(layer + ".")) and target.startswith("relax_cutlass")
    ]
    assert not local, "\n".join(local)


def test_the_library_does_not_import_the_testing_package():
    """relax_cutlass.testing (harness, model builders, GPU checks, the zoo) sits above the library:
    only the main job (`python -m relax_cutlass`, which builds an example model) may use it."""
    into_testing = [
        f"{module}:{line} imports {target}"
        for module, target, _, line in imports()
        if not module.startswith("relax_cutlass.testing")
        and module != "relax_cutlass.__main__"
        and (target == "relax_cutlass.testing" or target.startswith("relax_cutlass.testing."))
    ]
    assert not into_testing, "\n".join(into_testing)


ROOT = PACKAGE.parent
CALLERS = ("tests", "bench", "scripts")


def _caller_files() -> list[Path]:
    return [path for folder in CALLERS for path in sorted((ROOT / folder).rglob("*.py"))]


def test_tests_bench_and_scripts_import_through_the_testing_package_not_sys_path():
    """What tests, benchmarks and scripts share lives in relax_cutlass.testing, imported like any
    package: no file edits sys.path to reach another folder's modules."""
    edits = []
    for path in _caller_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys":
                edits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert _caller_files() and not edits, "\n".join(edits)


def test_tests_bench_and_scripts_import_no_underscore_names():
    private = []
    for path in _caller_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                private += [
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name} from {node.module}"
                    for a in node.names
                    if a.name.startswith("_") and not (node.module or "").startswith("tvm")
                ]
    assert not private, "\n".join(private)
