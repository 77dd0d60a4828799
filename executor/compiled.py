"""An opt-in compiled target step: ``torch.compile`` of the layers and the LM head, gpt-fast style.

gpt-fast (pytorch-labs/gpt-fast, ``generate.py``) compiles its decode step with Inductor over a static KV cache;
we do the same to :meth:`executor.model.Transformer.layers_and_head`, the tensor work of one forward after the
embedding. Input checks, the RoPE table lookup and the mask stay eager (they read tensor values), so every
decoder, drafter and rollback works unchanged on a compiled model.

Shapes: the number of new tokens ``n`` and the number of key slots change from call to call. With
``dynamic=True`` (the default) Inductor traces them as symbols and compiles one graph per code path (with and
without a mask, per ``exit_layer``); with ``dynamic=False`` each ``(n, slots)`` pair is its own static graph,
which suits a fixed bucket of verification sizes. :func:`warm_up` runs each bucket once so that compilation
happens before timing. Inductor's on-disk FX-graph cache (``TORCHINDUCTOR_CACHE_DIR``, default under
``/tmp/torchinductor_$USER``) makes later processes start faster.

Inductor needs a C++ compiler on the CPU. Where none is found, :func:`compile_model` prints one line and
leaves the model eager; a backend failure at the first call does the same.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

import torch
import torch._dynamo.exc
import torch._inductor.exc

from executor.model import Transformer

__all__ = ["compile_and_warm_up", "compile_model", "compiler_available", "warm_up"]


def compiler_available() -> bool:
    """Whether a C++ compiler for Inductor's CPU code is on the ``PATH`` (``$CXX``, ``c++``, ``g++``, ``clang++``)."""
    names = [os.environ.get("CXX"), "c++", "g++", "clang++"]
    return any(name and shutil.which(name) for name in names)


def _fallback(model: Transformer, reason: str) -> Transformer:
    print(f"specbound: running the model eagerly ({reason})", file=sys.stderr)
    model.step = None
    return model


def compile_model(model: Transformer, *, dynamic: bool = True, mode: str | None = None) -> Transformer:
    """Make ``model.forward`` run its layers and LM head through ``torch.compile``; returns ``model``.

    Parameters
    ----------
    model : Transformer
        Compiled in place (``model.step`` is set); the weights and the KV cache are shared, not copied.
    dynamic : bool
        Trace the token count and the slot count as symbols (one graph for all sizes) or specialise on each.
    mode : str, optional
        ``torch.compile`` mode, e.g. ``"max-autotune"``; default Inductor's default.

    Without a C++ compiler (or when Inductor fails at the first call) the model stays eager and one line says
    why on stderr. ``model.step = None`` undoes the compilation.
    """
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be an executor.model.Transformer, got {type(model).__name__}")
    if model.tok_embeddings.weight.device.type == "cpu" and not compiler_available():
        return _fallback(model, "torch.compile needs a C++ compiler and none was found")
    compiled = torch.compile(model.layers_and_head, dynamic=dynamic, fullgraph=True, mode=mode)

    def step(*args):
        try:
            return compiled(*args)
        except (torch._dynamo.exc.BackendCompilerFailed, torch._inductor.exc.InductorError) as error:
            _fallback(model, f"torch.compile failed: {str(error).splitlines()[0]}")
            return model.layers_and_head(*args)
        except torch._dynamo.exc.FailOnRecompileLimitHit as error:
            # fullgraph=True turns Dynamo's recompile limit into an error (seen when every prompt of a run
            # reallocated the KV cache with a new size); eager from here on rather than a crash mid-run.
            _fallback(model, f"torch.compile hit its recompile limit: {str(error).splitlines()[0]}")
            return model.layers_and_head(*args)

    model.step = step
    return model


def warm_up(model: Transformer, token_counts=(1, 2, 4, 8, 16, 32, 64), *, context: int = 16) -> float:
    """Run one forward per token count (after a ``context``-token prefill) so compilation happens now.

    Returns the seconds spent. Needs an allocated KV cache with room for ``context + max(token_counts)``
    slots; the cache content afterwards is garbage (positions are overwritten by the next prefill).
    """
    counts = sorted({int(n) for n in token_counts})
    if not counts or counts[0] < 1:
        raise ValueError(f"token_counts must be positive integers, got {token_counts!r}")
    if model.cache_slots < context + counts[-1]:
        raise ValueError(
            f"the KV cache has {model.cache_slots} slots; warm_up needs context + max(token_counts) = "
            f"{context + counts[-1]}"
        )
    device = model.tok_embeddings.weight.device
    began = time.perf_counter()
    with torch.no_grad():
        for start_slot, n in [(0, context), *((context, n) for n in counts)]:
            tokens = torch.zeros((model.cache_batch_size, n), dtype=torch.long, device=device)
            model(tokens, torch.arange(start_slot, start_slot + n, device=device))
    return time.perf_counter() - began


def compile_and_warm_up(
    model: Transformer, token_counts=(1, 2, 4, 8, 16), *, context: int = 16
) -> float | None:
    """:func:`compile_model` then :func:`warm_up` (a KV cache is set up if there is none big enough).

    Returns the seconds the warm-up took (compilation, or loading it from Inductor's cache), or ``None`` when
    the model stayed eager (no C++ compiler, or Inductor failed: the line on stderr says why). What the
    commands' ``--compile`` runs, so that compile time is reported apart from every measured time.
    """
    compile_model(model)
    if model.step is None:
        return None
    counts = sorted({int(n) for n in token_counts})
    if counts and model.cache_slots < context + counts[-1]:
        model.setup_cache(context + counts[-1], model.cache_batch_size or 1)
    seconds = warm_up(model, counts, context=context)
    return None if model.step is None else seconds
