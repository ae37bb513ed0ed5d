import os

import pytest
from hypothesis import settings

# The test command is a gate (CI runs it): property tests replay one fixed draw (derandomized), so a
# red run means a change broke something, not that a new random draw found an old edge.
# `HYPOTHESIS_PROFILE=explore` draws anew each run; an edge it finds becomes an @example of its test.
settings.register_profile("gate", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))

# On a machine whose GPU is the target, builds would profile kernels they have no tuning record for;
# the tests check the heuristic's choices (tests/test_tuning.py turns profiling on where it tests it).
os.environ.setdefault("RELAX_CUTLASS_PROFILE", "never")


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests share one object cache per session (RELAX_CUTLASS_CACHE_DIR wins if set, e.g. in CI
    to persist nvcc outputs across runs). Under pytest-xdist (`-n 2`) the workers share it too:
    it sits beside their own temporary folders, and objects are written atomically."""
    if "RELAX_CUTLASS_CACHE_DIR" not in os.environ:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            path = tmp_path_factory.getbasetemp().parent / "relax_cutlass_cache"
            path.mkdir(exist_ok=True)
        else:
            path = tmp_path_factory.mktemp("relax_cutlass_cache")
        os.environ["RELAX_CUTLASS_CACHE_DIR"] = str(path)
    yield
