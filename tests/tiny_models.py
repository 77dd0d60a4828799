"""Random tiny llama models for tests of the executor and of the validation job."""

from __future__ import annotations

import torch

from executor.model import ModelConfig, Transformer


def build_tiny_model(
    seed: int = 0,
    *,
    vocab_size: int = 12,
    n_layers: int = 2,
    dim: int = 16,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    hidden_dim: int = 32,
    tie_embeddings: bool = True,
    max_seq_len: int = 64,
    rope_theta: float = 10000.0,
) -> Transformer:
    """A random llama model in eval mode, without gradients, with its KV cache set up (batch size 1)."""
    config = ModelConfig(
        vocab_size=vocab_size,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        hidden_dim=hidden_dim,
        rope_theta=rope_theta,
        max_seq_len=max_seq_len,
        tie_embeddings=tie_embeddings,
    )
    model = Transformer(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                # Non-trivial norm gains, so that a loader mixing up the two norms of a layer is caught.
                parameter.copy_(1.0 + 0.2 * torch.randn(parameter.shape, generator=generator))
            elif parameter.ndim == 2 and name != "tok_embeddings.weight":
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[1] ** 0.5)
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
    model.requires_grad_(False).eval()
    model.setup_cache(max_seq_len)
    return model
