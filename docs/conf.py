"""Sphinx configuration: markdown pages (MyST) plus the API reference from the docstrings.

Build: `python -m sphinx -W --keep-going -b html docs build/docs` (tests/test_docs.py does, in CI).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import relax_cutlass  # noqa: E402

project = "relax_cutlass"
author = "the relax_cutlass developers"
copyright = "2026, the relax_cutlass developers"
release = relax_cutlass.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_heading_anchors = 3
exclude_patterns = ["_build"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
napoleon_numpy_docstring = True
napoleon_google_docstring = False
# Docstrings name TVM and CUTLASS types, which have no Sphinx inventory here.
nitpicky = False

html_theme = "furo"
html_title = f"relax_cutlass {release}"
