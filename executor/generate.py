"""One call to generate text with any decoder: the Python twin of ``specbound generate``."""

from __future__ import annotations

import torch

from executor.decoders import (
    TREE_VERIFIERS,
    AutoregressiveDecoder,
    ChainDecoder,
    Decoder,
    MultiDraftDecoder,
    Sampling,
    TreeDecoder,
    default_tree,
)
from executor.device import resolve_dtype
from executor.drafters import DRAFTER_KINDS, default_drafter, parse_drafter
from executor.drafters.parse import drafter_parts
from executor.logs import GenerationResult
from executor.quantize import resolve_quantize
from theory.checks import as_choice, as_count

__all__ = ["DECODERS", "build_decoder", "generate"]

DECODERS = ("ar", "chain", "multidraft", "tree")


def build_decoder(
    decoder: str,
    target,
    *,
    drafter: str | None = None,
    verifier: str | None = None,
    gamma: int = 4,
    n: int = 2,
    tree=None,
    sampling: Sampling | None = None,
    log_distributions: str = "none",
) -> Decoder:
    """A decoder by name (see :func:`generate` for the options); ``ValueError`` for unknown names."""
    decoder = as_choice(decoder, "decoder", DECODERS)
    if decoder == "ar":
        if drafter is not None or verifier is not None:
            raise ValueError("decoder 'ar' takes no drafter or verifier")
        return AutoregressiveDecoder(target, sampling=sampling, log_distributions=log_distributions)
    gamma, n = as_count(gamma, "gamma"), as_count(n, "n")  # before they become a tree's budget and depth
    draft = parse_drafter(default_drafter(target) if drafter is None else drafter, target)
    common = {"sampling": sampling, "log_distributions": log_distributions}
    if decoder == "chain":
        if verifier is not None:
            raise ValueError(
                "verifier applies to the multidraft and tree decoders; chain uses speculative sampling"
            )
        return ChainDecoder(target, draft, gamma=gamma, **common)
    if decoder == "multidraft":
        return MultiDraftDecoder(target, draft, n=n, verifier=verifier or "rrs", **common)
    shape = default_tree(draft, gamma, n) if tree is None else tree
    return TreeDecoder(target, draft, tree=shape, verifier=verifier or "rrs_wor", **common)


def generate(
    prompt: str,
    *,
    model=None,
    tokenizer=None,
    source: str | None = None,
    dtype: str | torch.dtype = "auto",
    quantize: str | None = None,
    chat: bool = False,
    decoder: str = "ar",
    drafter: str | None = None,
    verifier: str | None = None,
    gamma: int = 4,
    n: int = 2,
    tree=None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    max_new_tokens: int = 64,
    seed: int = 0,
    log_distributions: str = "none",
    stop_at_eos: bool = True,
) -> GenerationResult:
    """Generate a continuation of ``prompt`` with the chosen decoder and drafter.

    Parameters
    ----------
    prompt : str
        The text to continue (non-empty).
    model, tokenizer : optional
        A loaded :class:`executor.model.Transformer` and its tokenizer; default
        :func:`executor.weights.load_model` of ``source`` (``None`` = the embedded SmolLM2-135M-Instruct).
    dtype : str or torch.dtype
        Precision of the loaded model: ``"float32"``, ``"bfloat16"``, a floating ``torch.dtype`` or ``"auto"``
        (default: :func:`executor.device.default_dtype`, bfloat16 on CUDA and on CPUs with native bfloat16).
        With ``model`` given, ``"auto"`` keeps the model's dtype and any other value must equal it.
    quantize : str, optional
        ``None``/``"none"`` or ``"int8"`` (weight-only int8, :mod:`executor.quantize`) for the loaded model;
        with ``model`` given, ``None`` keeps it as it is and any other value must match it.
    chat : bool
        Wrap ``prompt`` as one user message with the tokenizer's chat template.
    decoder : str
        ``"ar"`` (autoregressive), ``"chain"`` (speculative sampling), ``"multidraft"`` or ``"tree"``.
    drafter : str, optional
        ``"early-exit:K"`` (the target's first K layers), ``"ngram"`` (prompt lookup) or ``"model:PATH"``;
        default :func:`executor.drafters.default_drafter`.
    verifier : str, optional
        Multi-draft / tree verifier: ``"rrs"`` (multidraft default), ``"rrs_wor"`` (tree default), ``"kseq"``,
        ``"spechub"``, ``"greedy"``, ``"optimal"``. Temperature 0 always verifies by argmax.
    gamma : int
        Draft length (chain) or tree depth (tree).
    n : int
        Drafts per step (multidraft) or children per node (tree).
    tree : theory.Tree or parent array, optional
        A static tree for ``decoder="tree"``; default a dynamic tree of ``gamma * n + 1`` nodes,
        ``gamma`` levels and ``n`` children per node; with the ``falcon`` drafter Falcon's pass-by-pass tree
        :func:`executor.decoders.falcon_tree` with ``ceil(gamma / 2)`` passes and width ``n``.
    temperature, top_k, top_p
        Sampling (temperature 0 = greedy).
    max_new_tokens : int
        ``>= 0``.
    seed : int
        Seed of the ``torch.Generator`` used for every random draw.
    log_distributions : str
        ``"none"``, ``"full"`` or ``"topk:K"`` (see :mod:`executor.logs`).
    stop_at_eos : bool
        Stop after the tokenizer's end-of-sequence token.

    Returns
    -------
    GenerationResult
        Token ids, text, per-step logs, :math:`\\tau`, per-position acceptance and tokens per second.
    """
    # Cheap checks first, so that bad options fail before the model is loaded.
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    as_choice(decoder, "decoder", DECODERS)
    as_count(gamma, "gamma")
    as_count(n, "n")
    if verifier is not None:
        as_choice(verifier, "verifier", TREE_VERIFIERS)
    if drafter is not None and any(
        part.partition(":")[0] not in DRAFTER_KINDS for part in drafter_parts(drafter)
    ):
        raise ValueError(
            f"unknown drafter {drafter!r}; use one of {', '.join(DRAFTER_KINDS)} (with its ':ARGUMENT' where "
            "needed), or 'ngram[:N]+DRAFTER'"
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    scheme = resolve_quantize(quantize)
    explicit = not (isinstance(dtype, str) and dtype == "auto")
    wanted = resolve_dtype(dtype, None if model is None else model.tok_embeddings.weight.device)
    if model is None:
        from executor.weights import load_model

        model, tokenizer = load_model(source, dtype=wanted, quantize=scheme)
    elif tokenizer is None:
        raise ValueError("pass the tokenizer together with the model")
    elif explicit and model.tok_embeddings.weight.dtype != wanted:
        raise ValueError(
            f"dtype {dtype!r} differs from the given model's {model.tok_embeddings.weight.dtype}; "
            "convert the model or pass dtype='auto'"
        )
    elif quantize is not None and model.quantization != scheme:
        raise ValueError(
            f"quantize {quantize!r} differs from the given model's ({model.quantization or 'none'}); "
            "quantise the model with executor.quantize.quantize_model or pass quantize=None"
        )
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
    runner = build_decoder(
        decoder,
        model,
        drafter=drafter,
        verifier=verifier,
        gamma=gamma,
        n=n,
        tree=tree,
        sampling=sampling,
        log_distributions=log_distributions,
    )
    device = model.tok_embeddings.weight.device
    generator = torch.Generator(device=device).manual_seed(seed)
    eos_id = tokenizer.eos_id if stop_at_eos else None
    result = runner.generate(tokenizer.encode(text), max_new_tokens, generator=generator, eos_id=eos_id)
    result.text = tokenizer.decode(result.token_ids)
    return result
