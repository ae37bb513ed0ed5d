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
        "relax_cutlass.models",
    ),
    "relax_cutlass.kinds": (
        "relax_cutlass.stages", "relax_cutlass.rewrites", "relax_cutlass.pipeline", "relax_cutlass.transform",
        "relax_cutlass.frontend", "relax_cutlass.extend", "relax_cutlass.tune", "relax_cutlass.models",
    ),
    "relax_cutlass.stages": (
        "relax_cutlass.pipeline", "relax_cutlass.transform", "relax_cutlass.frontend", "relax_cutlass.extend",
        "relax_cutlass.tune", "relax_cutlass.models",
    ),
    "relax_cutlass.rewrites": (
        "relax_cutlass.stages", "relax_cutlass.pipeline", "relax_cutlass.transform", "relax_cutlass.frontend",
        "relax_cutlass.extend", "relax_cutlass.tune", "relax_cutlass.models",
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
