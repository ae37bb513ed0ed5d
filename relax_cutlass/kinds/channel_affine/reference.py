"""The float32 numpy reference of the channel-affine kind (numpy only)."""

from __future__ import annotations

import numpy as np

from ..reference import ACTIVATION_REFERENCE


def reference(parts, gamma, beta, mean, var, epsilon: float, activation: str = "relu") -> np.ndarray:
    """act(batch_norm(concat(parts, last axis))) in float32."""
    x = np.concatenate([p.astype("float32") for p in parts], axis=-1)
    scale = gamma.astype("float32") / np.sqrt(var.astype("float32") + np.float32(epsilon))
    return ACTIVATION_REFERENCE[activation]((x - mean.astype("float32")) * scale + beta.astype("float32"))
