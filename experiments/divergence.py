"""Where a greedy decoder's text first departs from plain decoding, and whether the target's logits there were
tied or one rounding step apart (:func:`first_divergence`).

A lossless speculative decoder reproduces plain greedy decoding exactly only if the verifying pass, which
scores several positions at once, rounds exactly like plain decoding's one-token passes. In bfloat16 it does
not, and two tokens whose logits are tied or one bf16 step apart can swap places. Used by ``specbound
methods`` (the greedy-identity column) and ``specbound bench`` (``agrees_with_ar_up_to_ties``).
"""

from __future__ import annotations

__all__ = ["first_divergence"]


def first_divergence(model, prompt, reference, tokens) -> dict | None:
    """Where greedy ``tokens`` first differ from plain decoding's ``reference`` (``None``: they do not), and
    how far apart the target's logits put the two tokens there.

    One forward over the prompt and the common prefix gives the logits; ``gap`` is ``|z_a - z_b|`` and
    ``spacing`` the distance between neighbouring values at that magnitude in the coarser of the logits' and
    the model's dtype (bf16 keeps 8 significant bits: 0.25 at 33). A lossless decoder in bfloat16 can still diverge from plain decoding where
    ``gap <= spacing``: the verifying pass over several positions rounds differently from a one-token pass, and
    two tokens one rounding step apart (or tied) swap places. A divergence with ``gap > spacing`` is not that.
    """
    import math

    import torch

    reference, tokens = list(reference), list(tokens)
    position = next((i for i, (a, b) in enumerate(zip(reference, tokens, strict=False)) if a != b), None)
    if position is None:
        return None if len(reference) == len(tokens) else {"position": min(len(reference), len(tokens))}
    ids = list(prompt) + reference[:position]
    device = model.tok_embeddings.weight.device
    model.setup_cache(len(ids))
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=device), torch.arange(len(ids), device=device))[0, -1]
    a, b = reference[position], tokens[position]
    za, zb = float(logits[a]), float(logits[b])
    # The model's dtype bounds the logits' precision even when they are handed back in float32.
    dtypes = [logits.dtype, model.tok_embeddings.weight.dtype]
    eps = max(torch.finfo(d).eps for d in dtypes if d.is_floating_point)
    magnitude = max(abs(za), abs(zb), torch.finfo(torch.float32).tiny)
    spacing = eps * 2.0 ** math.floor(math.log2(magnitude))
    gap = abs(za - zb)
    return {
        "position": position,
        "reference_token": a,
        "token": b,
        "logits": [za, zb],
        "gap": gap,
        "spacing": spacing,
        "within_one_step": gap <= spacing,
    }
