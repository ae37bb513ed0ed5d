"""Attention written in plain PyTorch as decoders write it, for tests of what torch.export gives."""

from __future__ import annotations

try:
    import torch
except ImportError as err:  # pragma: no cover
    raise ImportError(
        "relax_cutlass.testing.models.torch_attention needs PyTorch: pip install 'relax_cutlass[models]'"
    ) from err


class CausalAttention(torch.nn.Module):
    """softmax(q k^T * scale + mask) v on (B, N, S, H) q, k, v with the mask built from aranges,
    as decoders build it:
    `kind` "top_left" / "bottom_right" (causal), "window" (causal in form, not in value), "none"
    (`arange >= 0`: hides nothing, as Hugging Face's BERT builds it without an attention_mask),
    `masked` the value of a hidden key (-inf or finfo(float32).min); `group` > 1: k and v have
    N / group heads, repeated across the query heads (`repeat`)."""

    def __init__(self, kind: str, masked: float = float("-inf"), group: int = 1, tile: bool = False):
        super().__init__()
        self.kind, self.masked, self.group, self.tile = kind, masked, group, tile

    def forward(self, q, k, v):
        if self.group > 1:  # grouped-query k and v: (B, N / group, T, H), repeated across the heads
            k, v = (self.repeat(x) for x in (k, v))
        rows, keys = q.shape[-2], k.shape[-2]
        i = torch.arange(rows)[:, None] + (keys - rows if self.kind == "bottom_right" else 0)
        j = torch.arange(keys)[None, :]
        keep = j <= i
        if self.kind == "window":
            keep = keep & (j > i - 3)
        if self.kind == "none":
            keep = (j >= 0).expand(rows, keys)
        mask = torch.where(keep, 0.0, self.masked)[None, None]
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        out = torch.softmax(scores.float() + mask, dim=-1).to(q.dtype) @ v
        return out.transpose(1, 2)  # (B, S, N, H), as a model merges the heads back

    def repeat(self, x):
        """transformers' repeat_kv (query head n reads kv head n // group), or with `tile` torch's
        repeat (query head n reads kv head n % N_kv)."""
        b, heads, t, h = x.shape
        if self.tile:
            return x.repeat(1, self.group, 1, 1)
        return x[:, :, None].expand(b, heads, self.group, t, h).reshape(b, heads * self.group, t, h)


class MultiQueryAttention(torch.nn.Module):
    """Multi-query attention as Falcon writes it: torch's scaled_dot_product_attention of (B, N, S, H)
    queries with (B, 1, T, H) keys and values (sdpa broadcasts the one kv head over the query heads),
    causal, with a boolean padding mask, or with the kv head broadcast by an explicit `expand`."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form

    def forward(self, q, k, v, keep):
        f = torch.nn.functional.scaled_dot_product_attention
        if self.form == "causal":
            out = f(q, k, v, is_causal=True)
        elif self.form == "padding":
            out = f(q, k, v, attn_mask=keep[:, None, None, :])
        else:  # "expand": the repeat written out, then plain attention
            k, v = (x.expand(-1, q.shape[1], -1, -1) for x in (k, v))
            out = torch.softmax((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5, dim=-1) @ v
        return out.transpose(1, 2)
