"""An opt-in compiled target step: ``torch.compile`` of the layers and the LM head, gpt-fast style.

gpt-fast (pytorch-labs/gpt-fast, ``generate.py``) compiles its decode step with Inductor over a static KV cache;
we do the same to :meth:`executor.model.Transformer.layers_and_head`, the tensor work of one forward after the
embedding. Input checks, the RoPE table lookup and the mask stay eager (they read tensor values), so every
decoder, drafter and rollback works unchanged on a compiled model.

Shapes and recompiles: the number of new tokens ``n`` and the number of key slots change from call to call,
and the KV cache's size from prompt to prompt (every ``generate`` allocates ``len(prompt) + max_new_tokens +
one tree`` slots). With ``dynamic=True`` (the default) all three are traced as symbols, so one run compiles a
bounded number of graphs whatever its number of prompts: one per code path -- the first call's shape (a
prefill, whose key slots equal its tokens), one token without a mask, several tokens under a mask, and each
``exit_layer`` an early-exit drafter uses (3 graphs for plain decoding plus prompt lookup). This rests on the
cache tensors being plain attributes of :class:`executor.model.KVCache`, not registered buffers: Dynamo gives
a module's buffers static shapes (``torch._dynamo.config.force_parameter_static_shapes``; ``mark_dynamic`` is
ignored there), so with buffers every prompt failed the guard ``kv_cache.k size mismatch at index 2`` twice
(with and without a mask) and the fifth prompt hit Dynamo's recompile limit of 8 (``TORCH_LOGS=recompiles``,
on a tiny model and on SmolLM2, where each new cache size cost 133-173 s of compiling under load). That fix
changes no computation, so eager results are bitwise unchanged; keeping an over-sized allocation or rounding
slot counts up to buckets would have changed ``setup_cache``'s contract and still recompiled once per bucket.
With ``dynamic=False`` each ``(n, slots, cache size)`` is its own static graph: for fixed-shape measurements
only (a decoding run reaches the recompile limit within its first prompt).
:func:`warm_up` runs each bucket once so that compilation happens before timing.

Products: float32 products on the CPU stay on oneDNN's packed weights (:mod:`executor.products`): the
operator ``torch.ops.specbound.packed_linear`` is one opaque call in the graph, and Inductor fuses the norms,
RoPE, SwiGLU and residual additions between the calls. Inductor's own weight packing (``freezing``) is not
used: alone it picks MKL's packed GEMM for float32 on x86, slower here at 2-8 rows; with ``max_autotune_gemm``
its C++ micro-GEMM ran SmolLM2 one token in 23-28 ms against 35 (separate runs), but each process compiled for
5-8 minutes (a graph with frozen weights bypasses the compile cache), and its graphs guard on the identity of
the KV-cache tensors, so every prompt's new cache recompiled them until Dynamo's limit sent a multi-prompt run
back to eager (docs/benchmarks/model_forward.md).

Compile cache: Inductor's on-disk FX-graph cache lets a later process load the compiled graphs instead of
compiling them again (Dynamo still traces the model). :func:`compile_model` points it at
``$XDG_CACHE_HOME/specbound/inductor`` (next to the drafters) unless ``TORCHINDUCTOR_CACHE_DIR`` is set
(Inductor's own default is ``/tmp/torchinductor_$USER``, which a reboot empties).

On a CPU, call ``torch.set_flush_denormal(True)`` at the start of a program that compiles the model (before
torch starts its worker threads, which copy the setting): Inductor's kernels run 5-50x slower on subnormal
floats, which eager BLAS flushes (``docs/executor.md``); the CLI's ``--compile`` does it.

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
from executor.products import native_available, packing_available

__all__ = ["compile_and_warm_up", "compile_model", "compiler_available", "inductor_cache_dir", "warm_up"]


def compiler_available() -> bool:
    """Whether a C++ compiler for Inductor's CPU code is on the ``PATH`` (``$CXX``, ``c++``, ``g++``, ``clang++``)."""
    names = [os.environ.get("CXX"), "c++", "g++", "clang++"]
    return any(name and shutil.which(name) for name in names)


def inductor_cache_dir() -> str:
    """Where Inductor caches compiled graphs: ``$TORCHINDUCTOR_CACHE_DIR`` when the user set it, else
    ``$XDG_CACHE_HOME/specbound/inductor`` (``~/.cache/specbound/inductor``).

    Importing ``torch._dynamo`` sets the variable to Inductor's default (``/tmp/torchinductor_$USER``), so that
    value counts as unset.
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from executor.training.checkpoint import cache_root

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and os.path.abspath(chosen) != os.path.abspath(default_cache_dir()):
        return chosen
    return str(cache_root() / "inductor")


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
        Trace the token count, the slot count and the KV cache's size as symbols (one graph per code path for
        all sizes, the default) or specialise on each (module docstring).
    mode : str, optional
        ``torch.compile`` mode, e.g. ``"max-autotune"``; default Inductor's default.

    Without a C++ compiler (or when Inductor fails at the first call) the model stays eager and one line says
    why on stderr. ``model.step = None`` undoes the compilation. Sets ``TORCHINDUCTOR_CACHE_DIR`` to
    :func:`inductor_cache_dir` (a value already set is kept).
    """
    if not isinstance(model, Transformer):
        raise ValueError(f"model must be an executor.model.Transformer, got {type(model).__name__}")
    if model.tok_embeddings.weight.device.type == "cpu" and not compiler_available():
        return _fallback(model, "torch.compile needs a C++ compiler and none was found")
    packing_available()  # probed eagerly: the probe cannot run while Dynamo traces
    native_available(model.tok_embeddings.weight.dtype)  # built eagerly, for the same reason
    # Inductor reads it when it compiles (its compile workers inherit it); set before the first compilation.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_dir()
    compiled = torch.compile(model.layers_and_head, dynamic=dynamic, fullgraph=True, mode=mode)

    def step(*args):
        try:
            return compiled(*args)
        except (torch._dynamo.exc.BackendCompilerFailed, torch._inductor.exc.InductorError) as error:
            _fallback(model, f"torch.compile failed: {str(error).splitlines()[0]}")
            return model.layers_and_head(*args)
        except torch._dynamo.exc.FailOnRecompileLimitHit as error:
            # fullgraph=True turns Dynamo's recompile limit into an error (it was hit when the cache size was a
            # static shape, see the module docstring); eager from here on rather than a crash mid-run.
            _fallback(model, f"torch.compile hit its recompile limit: {str(error).splitlines()[0]}")
            return model.layers_and_head(*args)

    model.step = step
    return model


def warm_up(model: Transformer, token_counts=(1, 2, 4, 8, 16, 32, 64), *, context: int = 16) -> float:
    """Run one forward per token count (after a ``context``-token prefill) so compilation happens now.

    Returns the seconds spent. Needs an allocated KV cache of more than ``context + max(token_counts)`` slots:
    a call whose key slots fill the whole cache is a graph of its own (its key view is contiguous), which no
    decoder needs (``generate`` allocates one tree beyond its last position). The cache content afterwards is
    garbage (positions are overwritten by the next prefill).
    """
    counts = sorted({int(n) for n in token_counts})
    if not counts or counts[0] < 1:
        raise ValueError(f"token_counts must be positive integers, got {token_counts!r}")
    if model.cache_slots <= context + counts[-1]:
        raise ValueError(
            f"the KV cache has {model.cache_slots} slots; warm_up needs more than context + max(token_counts) "
            f"= {context + counts[-1]}"
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
    if counts and model.cache_slots <= context + counts[-1]:
        model.setup_cache(context + counts[-1] + 1, model.cache_batch_size or 1)
    seconds = warm_up(model, counts, context=context)
    return None if model.step is None else seconds
