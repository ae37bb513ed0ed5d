"""The float32 numpy reference of the bias + activation kind (numpy only)."""

from __future__ import annotations

import numpy as np

from ..reference import ACTIVATION_REFERENCE


def reference(x: np.ndarray, bias: np.ndarray, activation: str) -> np.ndarray:
    """act(x + bias) in float32, bias broadcast over the leading axes."""
    return ACTIVATION_REFERENCE[activation](x.astype("float32") + bias.astype("float32"))
