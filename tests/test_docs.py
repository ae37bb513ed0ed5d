"""The documentation site builds without warnings, and troubleshooting covers every error raised."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "relax_cutlass"
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"


def _normalized(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _significant(fragments: list[str]) -> list[str]:
    """The literal parts of a message that say something (12+ characters), without the leading
    punctuation and names between them, cut at the first C format or template placeholder."""
    parts = (re.split(r"[%$]", re.sub(r"^(\$name|%s|[\s:;,()`'-])+", "", _normalized(f)))[0].strip() for f in fragments)
    return [p for p in parts if len(p) >= 12]


def _covered(fragments: list[str], doc: str) -> bool:
    """A message is documented when the start of one of its significant parts is; a message made
    only of placeholders ("%s failed: %s") when its shape is."""
    significant = _significant(fragments)
    if significant:
        return any(p[:30] in doc for p in significant)
    shapes = (re.sub(r"\\\$name|%(ll|z)?[sdu]", ".*?", re.escape(_normalized(f))) for f in fragments if f.strip())
    return any(re.search(shape, doc) for shape in shapes)


def _python_raises() -> list[tuple[str, list[str], str]]:
    """(where, literal parts of the message, exception class) for every raise / warnings.warn of the
    library (not of relax_cutlass.testing, whose errors reach the project's tests, not its users)."""
    found = []
    for path in sorted(p for p in PACKAGE.rglob("*.py") if not p.is_relative_to(PACKAGE / "testing")):
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.exc if isinstance(node, ast.Raise) else node if isinstance(node, ast.Call) else None
            if not isinstance(call, ast.Call):
                continue
            name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            if isinstance(node, ast.Call) and name != "warn":
                continue
            if name == "AttributeError":  # the module's __getattr__: Python's own protocol
                continue
            parts = [
                c.value
                for arg in call.args[:1]
                for c in ast.walk(arg)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            ]
            category = ast.unparse(call.args[1]) if name == "warn" and len(call.args) > 1 else name
            found.append((f"{path.relative_to(PACKAGE)}:{node.lineno}", parts, category))
    return found


def _cpp_errors() -> list[tuple[str, list[str]]]:
    """(where, string literals) of every error the generated C++ can raise or return."""
    found = []
    for path in sorted([*(PACKAGE / "stages").rglob("*.py"), *(PACKAGE / "kinds").rglob("*.py")]):
        text = path.read_text()
        for match in re.finditer(r"(Raise\(\"\w+\",|snprintf\(message|return \"\$name)[^;]*;", text):
            literals = re.findall(r'"((?:[^"\\]|\\.)*)"', match.group(0))
            if match.group(0).startswith("Raise("):
                literals = literals[1:]  # the exception type
            if any(len(lit) >= 12 for lit in literals):
                found.append((f"{path.relative_to(PACKAGE)}:{text[: match.start()].count(chr(10)) + 1}", literals))
    return found


def test_every_python_error_is_in_troubleshooting():
    doc = _normalized(TROUBLESHOOTING.read_text())
    raises = _python_raises()
    assert len(raises) > 40
    missing = [
        (where, parts, category)
        for where, parts, category in raises
        if not _covered(parts, doc) and not (not _significant(parts) and category in doc)
    ]
    assert not missing, f"document these errors in docs/troubleshooting.md: {missing}"


def test_every_generated_cpp_error_is_in_troubleshooting():
    doc = _normalized(TROUBLESHOOTING.read_text())
    errors = _cpp_errors()
    assert len(errors) >= 10
    missing = [(where, lits) for where, lits in errors if not _covered(lits, doc)]
    assert not missing, f"document these errors in docs/troubleshooting.md: {missing}"


def test_docs_build_without_warnings(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html", "docs", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "api.html").exists() and "register_activation" in (tmp_path / "api.html").read_text()
