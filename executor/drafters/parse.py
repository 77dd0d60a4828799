"""Build a drafter from its command-line name."""

from __future__ import annotations

from executor.drafters.early_exit import EarlyExitDrafter
from executor.drafters.ngram import PromptLookupDrafter
from executor.drafters.separate_model import ModelDrafter

__all__ = [
    "DRAFTER_KINDS",
    "default_drafter",
    "drafter_parts",
    "feature_checkpoint",
    "kind_checkpoint",
    "parse_drafter",
    "is_lookup_first",
    "trained_default_drafter",
]

#: ``ngram+D``: the shortest suffix match trusted over ``D``, and the longest chain ``D`` drafts. Chosen on
#: HumanEval/100-107 by ``experiments.bench_lookup_first --compile`` (compiled bfloat16, T = 0, the self-distilled
#: feature head: a 2-token match with 1 head token 1.381x, with 2 or 3 tokens 1.265x and 1.254x, a 1- or 3-token
#: match 1.196-1.354x, prompt lookup alone 1.274x; docs/bench.md), not on the prompts the benchmarks report.
LOOKUP_MIN_NGRAM = 2
LOOKUP_MODEL_TOKENS = 1

#: Drafter names on the command line (before the optional ``:ARGUMENT``).
DRAFTER_KINDS = ("early-exit", "ngram", "model", "feature", "falcon", "exit", "kangaroo")


def default_drafter(target, *, train_if_missing: bool = False) -> str:
    """The drafter used when none is named: the trained feature head when one is cached for ``target``.

    The one default of :func:`executor.generate.generate` and ``specbound validate`` (which passes
    ``train_if_missing=True`` and so trains the head on first use, see :func:`trained_default_drafter`).
    Without a checkpoint: the target's first two thirds of layers (``"early-exit:K"``; ``"early-exit:20"`` on
    SmolLM2-135M), with a message saying so.
    """
    fallback = f"early-exit:{max(target.config.n_layers * 2 // 3, 1)}"
    return trained_default_drafter(target, fallback, train_if_missing=train_if_missing)


def parse_drafter(spec: str, target, *, load=None):
    """Build a drafter from its command-line name.

    ``"early-exit:K"`` -> :class:`EarlyExitDrafter` on ``target`` with ``exit_layer = K``; ``"ngram"`` (or
    ``"ngram:N"`` for ``max_ngram = N``) -> :class:`PromptLookupDrafter`; ``"model:PATH"`` ->
    :class:`ModelDrafter` on the model ``load(PATH)`` returns (``load`` defaults to
    :func:`executor.weights.load_model`, returning ``(model, tokenizer)``); ``"feature"`` ->
    :class:`FeatureDrafter` from the cached checkpoint for ``target`` (trained first, with a message, when there
    is none: :func:`feature_checkpoint`); ``"feature:PATH"`` -> the checkpoint directory ``PATH``;
    ``"falcon"`` / ``"falcon:PATH"`` -> :class:`FalconDrafter` the same way; ``"ngram[:N]+D"`` -> a
    :class:`LookupFirstDrafter`: prompt lookup where the context's suffix matches at least
    :data:`LOOKUP_MIN_NGRAM` tokens, else up to :data:`LOOKUP_MODEL_TOKENS` drafts of ``D``.
    """
    if not isinstance(spec, str):
        raise ValueError(
            f"drafter must be a string such as 'early-exit:8', 'ngram' or 'model:PATH'; got {spec!r}"
        )
    if is_lookup_first(spec):
        return _lookup_first(spec, target, load)
    kind, _, argument = spec.partition(":")
    if kind == "early-exit":
        if not argument.isdigit():
            raise ValueError(f"drafter 'early-exit:K' needs an integer exit layer K; got {spec!r}")
        return EarlyExitDrafter(target, int(argument))
    if kind == "ngram":
        if argument and not argument.isdigit():
            raise ValueError(f"drafter 'ngram:N' needs an integer n-gram size N; got {spec!r}")
        return PromptLookupDrafter(int(argument)) if argument else PromptLookupDrafter()
    if kind == "model":
        if not argument:
            raise ValueError("drafter 'model:PATH' needs a path to the draft model's weights")
        if load is None:
            from executor.weights import load_model as load
        loaded = load(argument)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        weight = target.tok_embeddings.weight
        return ModelDrafter(model.to(weight.device, weight.dtype).requires_grad_(False).eval(), name=spec)
    if kind == "feature":
        from executor.drafters.feature import FeatureDrafter

        path = argument if argument else feature_checkpoint(target)
        return FeatureDrafter.from_checkpoint(target, path, name=spec)
    if kind in ("exit", "kangaroo"):
        return _layer_drafter(spec, target)
    if kind == "falcon":
        from executor.drafters.falcon import FalconDrafter

        path = argument if argument else kind_checkpoint(target, "falcon")
        return FalconDrafter.from_checkpoint(target, path, name=spec)
    raise ValueError(
        f"unknown drafter {spec!r}; use 'early-exit:K', 'ngram', 'model:PATH', 'feature[:PATH]', 'falcon[:PATH]', "
        "'exit:K[:PATH]' or 'kangaroo:K[:PATH]'"
    )


def is_lookup_first(spec: str) -> bool:
    """Whether ``spec`` names a :class:`LookupFirstDrafter` (``ngram[:N]+D``; a ``+`` elsewhere, e.g. in
    ``model:PATH``, is part of a path)."""
    return spec.startswith("ngram") and "+" in spec


def drafter_parts(spec: str) -> list[str]:
    """The drafter specs ``spec`` is made of: ``[ngram[:N], D]`` for ``ngram[:N]+D``, else ``[spec]``."""
    if is_lookup_first(spec):
        first, _, rest = spec.partition("+")
        return [first, rest]
    return [spec]


def _lookup_first(spec: str, target, load):
    from executor.drafters.hybrid import LookupFirstDrafter

    first, rest = drafter_parts(spec)
    if not rest:
        raise ValueError(f"a combined drafter is 'ngram[:N]+DRAFTER' (e.g. 'ngram+feature'); got {spec!r}")
    lookup = parse_drafter(first, target)
    lookup.min_ngram = min(LOOKUP_MIN_NGRAM, lookup.max_ngram)
    model = parse_drafter(rest, target, load=load)
    return LookupFirstDrafter(lookup, model, model_tokens=LOOKUP_MODEL_TOKENS, name=spec)


def _layer_drafter(spec: str, target):
    """``exit:K`` / ``kangaroo:K`` (the cached checkpoint, trained first when missing) or ``...:K:PATH``."""
    from executor.drafters.exit_head import ExitDrafter, KangarooDrafter

    family, _, rest = spec.partition(":")
    layer, _, path = rest.partition(":")
    if not layer.isdigit() or not 1 <= int(layer) < target.config.n_layers:
        raise ValueError(
            f"drafter '{family}:K[:PATH]' needs a layer K in [1, {target.config.n_layers}); got {spec!r}"
        )
    kind = f"{family}:{int(layer)}"
    cls = KangarooDrafter if family == "kangaroo" else ExitDrafter
    return cls.from_checkpoint(target, path or kind_checkpoint(target, kind), int(layer), name=spec)


def feature_checkpoint(target, *, train_if_missing: bool = True, tokenizer=None, log=None):
    """The best cached feature-head checkpoint for ``target`` (:func:`executor.training.trainer.cached_checkpoints`:
    best on the common ranking set); trains one first when there is none.

    Returns ``None`` when there is none and ``train_if_missing`` is false. ``log`` (default: print to stderr)
    receives the messages saying that a drafter is being trained and, after, what was trained.
    """
    return kind_checkpoint(target, "feature", train_if_missing=train_if_missing, tokenizer=tokenizer, log=log)


def kind_checkpoint(target, kind: str, *, train_if_missing: bool = True, tokenizer=None, log=None):
    """The best cached checkpoint of ``kind`` (``"feature"``, ``"falcon"``, ``"exit:K"``, ``"kangaroo:K"``) for ``target``;
    trains one first, with a message, when there is none (``None`` without ``train_if_missing``)."""
    import sys

    from executor.training import trainer

    found = trainer.cached_checkpoints(target, kind)
    if found:
        return found[0]
    if not train_if_missing:
        return None
    log = log or (lambda message: print(message, file=sys.stderr))
    log(
        f"no trained {kind} drafter for this model in the cache: training one now on the standard library "
        f"(minutes, once; `specbound train-drafter --kind {kind}` does the same)"
    )
    if tokenizer is None:
        from executor.weights import load_tokenizer

        tokenizer = load_tokenizer()
    path = trainer.train_drafter(target, tokenizer, kind=kind)
    log(_trained_summary(kind, path))
    return path


def _trained_summary(kind: str, path) -> str:
    """One line on a drafter trained on first use: where it is cached and, from its card, its steps and held-out
    acceptance (what `specbound train-drafter` prints at length)."""
    from executor.training.checkpoint import read_card

    card = read_card(path)
    line = f"{kind} drafter trained and cached at {path}"
    held = card.get("held_out", {})
    if "steps" in card and "sum_min" in held:
        line += f": {card['steps']} steps, held-out sum-min(p, q) {held['sum_min']:.3f} at T = 1"
    return line


_FALLBACK_SAID: set[str] = set()


def trained_default_drafter(target, fallback: str, *, train_if_missing: bool = False, log=None) -> str:
    """``"feature"`` when a trained feature head is cached for ``target``, else ``fallback`` with a message.

    The rule for the default drafter: the trained head when there is one. With ``train_if_missing`` (the main
    job, ``specbound validate``) it is trained first on the standard library -- only when ``target`` has the
    embedded model's vocabulary, which the corpus is tokenized with. The fallback message goes to ``log``
    (default: stderr), once per process and fallback.
    """
    import sys

    can_train = train_if_missing and _has_embedded_vocabulary(target)
    if feature_checkpoint(target, train_if_missing=can_train, log=log) is not None:
        return "feature"
    if fallback not in _FALLBACK_SAID:
        _FALLBACK_SAID.add(fallback)
        (log or (lambda message: print(message, file=sys.stderr)))(
            f"no trained feature drafter for this model in the cache; drafting with {fallback} "
            "(train one with `specbound train-drafter --kind feature`)"
        )
    return fallback


def _has_embedded_vocabulary(target) -> bool:
    from executor.weights import load_tokenizer

    try:
        return load_tokenizer().vocab_size == target.config.vocab_size
    except (ValueError, OSError):
        return False
