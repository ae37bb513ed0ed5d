"""Every tutorial notebook executes top to bottom (CPU here; its GPU cells run only with a GPU)."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="needs the 'test' extra (nbclient)")
from nbclient import NotebookClient  # noqa: E402

TUTORIALS = sorted((Path(__file__).resolve().parent.parent / "tutorials").glob("*.ipynb"))


def test_there_are_tutorials():
    assert len(TUTORIALS) >= 4


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_executes(path, tmp_path):
    book = nbformat.read(path, as_version=4)
    # Run in a scratch directory: the notebooks write libraries and tuning files next to themselves.
    NotebookClient(book, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
