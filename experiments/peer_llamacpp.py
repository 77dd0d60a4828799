"""llama.cpp as a peer: the same GGUF weights run by ``llama-cpp-python``, for ``bench`` and ``profile``.

``llama-cpp-python`` is an optional extra (``pip install 'specbound[llamacpp]'``, built from source: a C/C++
compiler and CMake, ~5 minutes; docs/bench.md), imported only inside the functions below, so everything else
(and the tests of the plumbing, with a fake ``Llama``) runs without it.

Weights (:data:`WEIGHTS`): ``q4_1`` is the embedded GGUF file itself (:func:`executor.weights.default_model_path`,
natively Q4_1); ``f32`` and ``bf16`` are made from it by llama.cpp's own quantizer
(``llama_model_quantize`` with ``allow_requantize``: every Q4_1 block dequantised, then stored as F32 -- the
same numbers our float32 model computes with -- or rounded to BF16), cached under
``$XDG_CACHE_HOME/specbound/llamacpp`` and written atomically (temporary file, then ``os.replace``).

Decoding goes through ``Llama.generate`` -- what a llama-cpp-python user calls -- greedy (``temp=0``, no
repeat penalty), plain or with ``LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=K)`` as its draft
model (llama-cpp-python then evaluates the drafts in one batch with logits for every position and keeps the
longest prefix that greedy decoding confirms). Its proposal rule is our
:class:`executor.drafters.PromptLookupDrafter` with ``max_ngram=2``: the longest suffix n-gram first (2, then
1), its first earlier occurrence, up to ``K`` tokens after it (``tests/experiments/test_peer_llamacpp.py``
checks the two agree token for token).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "LOOKUP_NGRAM",
    "WEIGHTS",
    "import_llama_cpp",
    "llamacpp_runner",
    "load_llama",
    "profile_llamacpp",
    "unsupported_weights_reason",
    "weights_path",
]

#: Weight formats of the peer and llama.cpp's ``llama_ftype`` for each (``None``: the embedded file as is).
WEIGHTS = {"q4_1": None, "f32": 0, "bf16": 32}
#: llama-cpp-python's default ``max_ngram_size`` of its prompt lookup (our drafter's ``max_ngram`` to match).
LOOKUP_NGRAM = 2
INSTALL = "llama-cpp-python is not installed; run: pip install 'specbound[llamacpp]' (builds from source)"


def import_llama_cpp():
    """The ``llama_cpp`` module, or ``ValueError`` naming the install command."""
    try:
        import llama_cpp
    except ImportError:
        raise ValueError(INSTALL) from None
    return llama_cpp


def _check_weights(weights: str) -> str:
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    return weights


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/specbound/llamacpp``: the F32 and BF16 files made from the embedded GGUF."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specbound" / "llamacpp"


def weights_path(weights: str, *, source: str | os.PathLike | None = None) -> Path:
    """The GGUF file of ``weights`` (:data:`WEIGHTS`), made with llama.cpp's quantizer on first use.

    ``source`` is the Q4_1 file (default the embedded model). The made file is named after the source's name,
    size and modification time, so a changed source is re-converted.
    """
    from executor.weights import default_model_path

    _check_weights(weights)
    source = Path(default_model_path() if source is None else source)
    if not source.is_file():
        raise ValueError(f"source {str(source)!r} is not a file")
    if WEIGHTS[weights] is None:
        return source
    stat = source.stat()
    target = cache_dir() / f"{source.stem}-{stat.st_size}-{int(stat.st_mtime)}-{weights}.gguf"
    if target.is_file():
        return target
    from executor.files import atomic_path

    llama_cpp = import_llama_cpp()
    with atomic_path(target, suffix=".gguf") as temporary:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = WEIGHTS[weights]
        params.allow_requantize = True  # the source is Q4_1: dequantise every block first
        status = llama_cpp.llama_model_quantize(
            str(source).encode(), str(temporary).encode(), llama_cpp.ctypes.byref(params)
        )
        if status != 0:
            raise ValueError(f"llama_model_quantize failed ({status}) making {weights} from {source}")
    return target


def unsupported_weights_reason(llama_cpp, weights: str) -> str | None:
    """Why llama.cpp as built cannot run ``weights`` here, or ``None``.

    One case is known: a build with llama.cpp's AMX backend (``AMX_INT8 = 1`` in its system info, what
    ``GGML_NATIVE=ON`` gives on an Intel Xeon with AMX) repacks Q4_1 weights for its AMX kernels, and the first
    pass over two or more tokens then kills the process with a segmentation fault (llama-cpp-python 0.3.36,
    2026-11-27: a 2-token ``eval`` of the embedded Q4_1 file; llama.cpp issue 20824 reports the same crash in
    ``ggml_backend_amx_mul_mat``). A crash cannot be caught, so it is refused before loading.
    """
    if _check_weights(weights) != "q4_1":
        return None
    info = llama_cpp.llama_print_system_info()
    info = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    if "AMX_INT8 = 1" not in info:
        return None
    return (
        "--peer-weights q4_1: this llama.cpp build has its AMX backend (AMX_INT8 = 1), whose Q4_1 kernels "
        "crash the process on a pass over several tokens (llama.cpp issue 20824); use --peer-weights f32,bf16, "
        "or rebuild llama-cpp-python without AMX (docs/bench.md)"
    )


def load_llama(weights: str, *, threads: int, lookup: int | None = None, n_ctx: int = 2048):
    """A ``llama_cpp.Llama`` on ``weights`` with ``threads`` threads (decoding and batches alike).

    ``lookup = K`` attaches ``LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=K)`` as the draft
    model (llama-cpp-python then keeps logits for every position of a batch, as verification needs).
    """
    llama_cpp = import_llama_cpp()
    reason = unsupported_weights_reason(llama_cpp, weights)
    if reason is not None:
        raise ValueError(reason)
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    if lookup is not None and (isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 1):
        raise ValueError(f"lookup must be an integer >= 1 (draft tokens), got {lookup!r}")
    draft = None if lookup is None else LlamaPromptLookupDecoding(LOOKUP_NGRAM, num_pred_tokens=lookup)
    return llama_cpp.Llama(
        model_path=str(weights_path(weights)),
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        draft_model=draft,
        verbose=False,
    )


def llamacpp_runner(llm):
    """``Llama.generate`` (greedy) as a bench runner: ``runner(prompt_ids, max_new_tokens, seed) -> Record``.

    The model state is reset first, so every run prefills its prompt (llama-cpp-python would otherwise reuse
    the KV cache of a previous run of the same prompt); the generation does not stop at the end-of-text
    token (our decoders are run the same way). ``first_token_seconds`` is the time to the first token
    (the prefill), so decoding alone can be compared.
    """
    from experiments.bench import Record

    def run(prompt_ids: list[int], max_new_tokens: int, seed: int) -> Record:
        llm.reset()
        tokens: list[int] = []
        start = time.perf_counter()
        first = None
        for token in llm.generate(list(prompt_ids), temp=0.0, repeat_penalty=1.0, reset=True):
            tokens.append(int(token))
            if first is None:
                first = time.perf_counter() - start
            if len(tokens) >= max_new_tokens:
                break
        seconds = time.perf_counter() - start
        return Record(tokens=len(tokens), seconds=seconds, token_ids=tokens, first_token_seconds=first)

    return run


def profile_llamacpp(
    llms: dict,
    context: Sequence[int],
    *,
    sizes: Sequence[int] = (1, 2, 4, 8, 16),
    repeats: int = 15,
    warmup: int = 2,
    progress: bool = False,
    propose=None,
    samples: dict | None = None,
) -> dict:
    """llama.cpp's own ``t(n)``, interleaved over several models: ``{name: measurement}`` (docs/profile.md).

    Per model (``llms[name]``, a ``Llama`` with logits for every position, as prompt lookup runs it), the
    ``context`` is evaluated once; then ``Llama.eval`` of ``n`` new tokens (the context's last token, then
    ``n - 1`` filler tokens of the context) at the positions right after it, which rolls the cache back to the
    context before each pass (``n_tokens`` reset; ``eval`` removes the stale cells, as ``generate`` does after
    a rejection). Each round measures every model and size once, in turn, after one untimed one-token pass of
    that model (the first pass after another model ran costs more); medians and quartiles over the
    ``repeats`` timed rounds. Also timed: one prompt-lookup proposal on the context (``lookup_time``) and one
    greedy ``sample`` (``sample_time``), the per-step and per-token work of ``generate`` besides the passes.
    ``propose(ids, max_ngram, k)`` is the lookup timed (default llama-cpp-python's own).

    ``samples`` (``{name: {"n" | "lookup" | "sample": [seconds, ...]}}``, JSON-ready) pools calls: this call's
    timed rounds are appended to it and the summaries cover every sample in it, so short profiles taken between
    a benchmark's rounds add up to one profile of the whole run.
    """
    from experiments.profiling import check_timing_arguments, summarise_times

    sizes, context = check_timing_arguments(sizes, repeats, warmup, context)
    committed = len(context) - 1
    filler = [context[i % len(context)] for i in range(sizes[-1])]
    import numpy as np

    if propose is None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        propose = LlamaPromptLookupDecoding.find_candidate_pred_tokens
    history = np.asarray(context, dtype=np.intc)
    for llm in llms.values():
        llm.reset()
        llm.eval(context[:-1])
        if hasattr(llm, "_init_sampler"):  # the greedy sampler chain generate() builds once per generation
            llm._sampler = llm._init_sampler(temp=0.0, repeat_penalty=1.0)

    def target(llm, n):
        llm.n_tokens = committed
        llm.eval([context[-1], *filler[1:n]])

    def sample(llm):
        llm.n_tokens = committed
        llm.eval([context[-1]])
        start = time.perf_counter()
        llm.sample(temp=0.0, repeat_penalty=1.0, idx=committed)
        return time.perf_counter() - start

    samples = {} if samples is None else samples
    for name in llms:
        for key in [*sizes, "lookup", "sample"]:
            samples.setdefault(name, {}).setdefault(str(key), [])
    rounds = range(warmup + repeats)
    if progress:
        from tqdm import tqdm

        rounds = tqdm(rounds, desc="llama.cpp profile", unit="round")
    for index in rounds:
        for name, llm in llms.items():
            # Untimed: the first pass after another model's work pays for waking this model's threads (bf16,
            # 2 threads: t(1) 24.0 ms first against 16.9 ms; a generation pays it once, in its prefill).
            target(llm, 1)
            for n in sizes:
                start = time.perf_counter()
                target(llm, n)
                elapsed = time.perf_counter() - start
                if index >= warmup:
                    samples[name][str(n)].append(elapsed)
            start = time.perf_counter()
            propose(history, LOOKUP_NGRAM, sizes[-1])
            lookup = time.perf_counter() - start
            sampled = sample(llm)
            if index >= warmup:
                samples[name]["lookup"].append(lookup)
                samples[name]["sample"].append(sampled)
    result = {}
    for name in llms:
        stats = [{"n": n, **summarise_times(samples[name][str(n)])} for n in sizes]
        base = stats[0]["median"]
        lookup = summarise_times(samples[name]["lookup"])
        result[name] = {
            "context_tokens": len(context),
            "repeats": stats[0]["repeats"],
            "warmup": warmup,
            "target": {
                "sizes": sizes,
                "times": [row["median"] for row in stats],
                "relative": [row["median"] / base for row in stats],
                "stats": stats,
            },
            "drafter": {
                "name": f"llama.cpp prompt lookup (max_ngram_size={LOOKUP_NGRAM})",
                "per_token": lookup,
                "per_level": {"widths": [1], "times": [lookup["median"]], "stats": [{"width": 1, **lookup}]},
                "draft_time": lookup["median"],
                "level_time": lookup["median"],
                "cost_ratio": lookup["median"] / base,
            },
            "sample_time": summarise_times(samples[name]["sample"]),
        }
    return result
