"""The rows of ``specbound bench`` on real models: the options, the models, the transformers peers and our
decoders (the engine that runs the rows is :mod:`experiments.bench`, the planned trees come from
:mod:`experiments.bench_plan`).

Rows, for every dtype and temperature of :class:`BenchConfig` (all on the same GGUF weights, same threads):

* ``hf-generate`` -- ``transformers`` ``generate`` (plain decoding); ``hf-prompt-lookup-kK`` --
  ``generate(prompt_lookup_num_tokens=K)`` (prompt lookup decoding, Saxena 2023); ``hf-early-exit`` --
  ``generate(assistant_early_exit=L)`` (LayerSkip self-speculation, Elhoushi et al., ACL 2024,
  arXiv 2404.16710, run as assisted generation). At temperature > 0 they sample (``top_k=0, top_p=1``, so the
  law is the plain softmax, as ours).
* with ``peer="llamacpp"`` instead: ``llamacpp`` -- llama.cpp's plain greedy decoding (``Llama.generate``) and
  ``llamacpp-lookup-kK`` -- its prompt lookup decoding with ``K`` draft tokens, on each of the GGUF weights
  ``q4_1`` (the embedded file), ``f32`` and ``bf16`` (made from it by llama.cpp's quantizer;
  :mod:`experiments.peer_llamacpp`), at temperature 0 only; their dtype column is ``q4_1``, ``float32`` and
  ``bfloat16``, so the F32 rows compare directly with our float32 ``ar``; and ``ar-int8``, ``ar-q4_1`` -- our
  plain decoding with the weight-only int8 target and with the file's own Q4_1 blocks (:mod:`executor.quantize`),
  in the float32 column. With ``compile`` every one of our targets runs compiled (:mod:`executor.compiled`)
  and ``ar-eager``, ``ar-int8-eager``, ``ar-q4_1-eager`` are the same plain decoding on eager twins.
* ``ar`` -- our plain decoding, the baseline of every speedup; ``chain-ngram-gK`` -- our chain decoder with
  the prompt-lookup drafter, ``K`` tokens.
* for every model drafter ``D`` (early exit at layer L, and the trained feature head when one is cached):
  ``chain-D`` (``gamma`` drafts; Leviathan et al., ICML 2023), ``chain-ngram+D`` (prompt lookup's proposal,
  up to the largest of ``lookups``, where the context's suffix matches 2 or more tokens, else one draft of
  ``D``: :class:`executor.drafters.LookupFirstDrafter` with the defaults of ``--drafter ngram+D``), ``tree-D`` (a DySpec/EAGLE-2 dynamic tree of
  ``2 gamma + 1`` nodes, or Falcon's pass-by-pass tree for a ``falcon`` drafter, as
  :func:`executor.decoders.default_tree` chooses), ``multidraft-V-nN-D`` (``N`` drafts verified by ``V`` = ``rrs``, recursive
  rejection sampling, ``rrs_wor`` (drafts without replacement), ``kseq`` (SpecTr's K-SEQ), ``spechub`` (at ``N = 2`` only),
  ``greedy`` (the greedy draft law and its optimal verifier, Hu et al., ICLR 2025, arXiv 2502.18779) or
  ``optimal``, the run-time optimal verifier for i.i.d. drafts (``docs/optimal_verifier.md``); at temperature 0 all
  are the argmax rule, so one ``multidraft-argmax-nN-D`` row), and
  ``plan-tree-D``: the static tree :func:`theory.plan_tree` (Sequoia, Chen et al., NeurIPS 2024,
  arXiv 2402.12374, §4.1) chooses from this run's measured forward costs and the drafter's measured
  acceptance per child rank.

How the planned trees are planned: :mod:`experiments.bench_plan`.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import asdict, dataclass
from functools import partial

from experiments.bench import Record, RowKey
from experiments.commands import QUANTIZE_CHOICES

__all__ = ["BenchConfig", "build_runners", "llamacpp_runners", "load_peer", "load_target", "model_drafters"]

DTYPES = ("float32", "bfloat16")
#: Multi-draft verifiers of the bench rows: i.i.d. drafts (RRS, K-SEQ, the optimal verifier), drafts without
#: replacement (RRS without replacement), SpecHub's hub draft law and Hu et al.'s greedy draft law (the top
#: ``N - 1`` tokens of ``q`` and one draw from the rest); the multi-draft decoder draws each one's law.
VERIFIERS = ("rrs", "rrs_wor", "kseq", "spechub", "greedy", "optimal")
PEERS = ("transformers", "llamacpp")
#: llama.cpp weights -> the dtype name of their rows (F32 rows sit next to our float32 ``ar``: ``vs ar``).
LLAMACPP_DTYPES = {"q4_1": "q4_1", "f32": "float32", "bf16": "bfloat16"}


@dataclass(frozen=True)
class BenchConfig:
    """Every option of ``specbound bench`` that changes what runs (checked here, parsed by the command).

    A new option (e.g. a weight quantisation) is one field here, one argument in
    :mod:`experiments.commands.bench` and its use in :func:`load_target`.
    """

    dtypes: tuple[str, ...] = DTYPES
    temperatures: tuple[float, ...] = (0.0, 1.0)
    exit_layer: int = 6
    gamma: int = 3
    lookups: tuple[int, ...] = (2,)
    drafters: tuple[str, ...] | None = None  # None: early-exit:exit_layer, plus the cached feature head
    ns: tuple[int, ...] = (2, 4)
    verifiers: tuple[str, ...] = ("rrs", "optimal")
    plan_budget: int = 16
    plan_depth: int = 6
    plan_width: int = 4
    latency_repeats: int = 5
    context: int = 256
    calibration_tokens: int = 32
    rows: tuple[str, ...] = ("*",)
    quantize: str = "none"  # our decoders' target: float weights or weight-only int8 (executor.quantize)
    peer: str = "transformers"  # whose rows run next to ours: transformers' generate or llama.cpp
    peer_weights: tuple[str, ...] = tuple(LLAMACPP_DTYPES)  # llama.cpp's GGUF weights (peer llamacpp)
    compile: bool = False  # our targets through torch.compile (executor.compiled); eager twins of plain rows

    def __post_init__(self) -> None:
        if not self.dtypes or any(d not in DTYPES for d in self.dtypes):
            raise ValueError(f"--dtypes must be a non-empty list of {', '.join(DTYPES)}; got {self.dtypes}")
        if not self.temperatures or any(not t >= 0 for t in self.temperatures):
            raise ValueError(f"--temperatures must be numbers >= 0, got {self.temperatures}")
        for name, value, minimum in (
            ("--exit-layer", self.exit_layer, 1),
            ("--gamma", self.gamma, 1),
            ("--plan-budget", self.plan_budget, 1),
            ("--plan-depth", self.plan_depth, 1),
            ("--plan-width", self.plan_width, 1),
            ("--latency-repeats", self.latency_repeats, 1),
            ("--context", self.context, 2),
            ("--calibration-tokens", self.calibration_tokens, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if any(k < 1 for k in self.lookups):
            raise ValueError(f"--lookups must be integers >= 1, got {self.lookups}")
        if any(n < 2 for n in self.ns):
            raise ValueError(f"--ns must be integers >= 2 (drafts per step), got {self.ns}")
        if any(v not in VERIFIERS for v in self.verifiers):
            raise ValueError(f"--verifiers must be among {', '.join(VERIFIERS)}, got {self.verifiers}")
        if "spechub" in self.verifiers and 2 not in self.ns:
            raise ValueError(
                f"--verifiers spechub needs 2 in --ns (SpecHub verifies two drafts), got {self.ns}"
            )
        if not self.rows:
            raise ValueError("--rows must hold at least one pattern")
        if self.peer not in PEERS:
            raise ValueError(f"--peer must be one of {', '.join(PEERS)}, got {self.peer!r}")
        if not self.peer_weights or any(w not in LLAMACPP_DTYPES for w in self.peer_weights):
            raise ValueError(
                f"--peer-weights must be a non-empty list of {', '.join(LLAMACPP_DTYPES)}, got {self.peer_weights}"
            )
        if self.quantize not in QUANTIZE_CHOICES:
            raise ValueError(
                f"--quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {self.quantize!r}"
            )

    def wants(self, decoder: str) -> bool:
        """Whether the row ``decoder`` matches one of the ``rows`` patterns (shell-style, ``*`` = any)."""
        return any(fnmatch.fnmatchcase(decoder, pattern) for pattern in self.rows)

    def to_json(self) -> dict:
        return asdict(self)


# --- models -----------------------------------------------------------------------------------------------


def load_target(dtype: str, config: BenchConfig):
    """Our model and tokenizer in ``dtype`` (the embedded SmolLM2-135M-Instruct): every row's target.

    With ``config.quantize == "int8"`` our rows run the weight-only int8 target (``ar`` included, so every
    ``vs ar`` ratio compares like with like); transformers' rows keep the float weights.
    """
    from executor.weights import load_model

    return load_model(device="cpu", dtype=dtype, quantize=config.quantize)


def load_peer(dtype: str, config: BenchConfig):
    """``transformers``' reading of the same GGUF file in ``dtype``: ``(model, tokenizer)``."""
    import torch

    from experiments.peers import load_transformers_model

    return load_transformers_model(dtype=getattr(torch, dtype))


def model_drafters(config: BenchConfig, target) -> dict[str, str]:
    """``{label: drafter spec}`` of the model drafters (labels name the rows: ``chain-<label>``)."""
    if config.drafters is None:
        from executor.drafters.parse import feature_checkpoint

        specs = [f"early-exit:{config.exit_layer}"]
        checkpoint = feature_checkpoint(target, train_if_missing=False)
        if checkpoint is not None:  # the trained head of `specbound train-drafter --kind feature`
            specs.append(f"feature:{checkpoint}")
    else:
        specs = list(config.drafters)
    kinds = [spec.partition(":")[0] for spec in specs]

    def label(kind: str, spec: str, whole: bool) -> str:
        # A kind given twice is told apart by the end of its argument: the layer (early-exit-12) or a cached
        # head's key (feature-c6f1757fcd, from .../feature-6e9008efa296-c6f1757fcd); by the whole spec if
        # those ends clash.
        if kinds.count(kind) == 1:
            return kind
        if whole:
            return spec.replace(":", "").replace("/", "_")
        return f"{kind}-{spec.partition(':')[2].rstrip('/').rsplit('/', 1)[-1].rsplit('-', 1)[-1]}"

    labels = [label(kind, spec, whole=False) for kind, spec in zip(kinds, specs, strict=True)]
    if len(set(labels)) < len(labels):
        labels = [label(kind, spec, whole=True) for kind, spec in zip(kinds, specs, strict=True)]
    return dict(zip(labels, specs, strict=True))


# --- runners ----------------------------------------------------------------------------------------------


def hf_runner(model, pad_id: int, temperature: float, options: dict):
    """``transformers`` ``generate`` as a bench runner (sampling seeded with ``torch.manual_seed``: its API)."""
    import torch

    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )

    def run(prompt_ids: list[int], max_new_tokens: int, seed: int) -> Record:
        ids = torch.tensor([prompt_ids])
        torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                pad_token_id=pad_id,
                **sampling,
                **options,
            )
        seconds = time.perf_counter() - start
        generated = out[0, ids.shape[1] :].tolist()
        return Record(tokens=len(generated), seconds=seconds, token_ids=generated)

    return run


def our_runner(decoder):
    """One of our decoders as a bench runner (its own ``torch.Generator`` seeded per round)."""
    import torch

    def run(prompt_ids: list[int], max_new_tokens: int, seed: int) -> Record:
        generator = torch.Generator().manual_seed(seed)
        return Record.from_generation(decoder.generate(prompt_ids, max_new_tokens, generator=generator))

    return run


def build_runners(config: BenchConfig, targets: dict, peers: dict, plans: list[dict]) -> dict:
    """``{RowKey: runner}`` for every row of the module docstring that ``config.rows`` selects.

    ``targets[dtype] = (model, {label: drafter spec})``; ``peers[dtype] = (hf_model, hf_tokenizer)`` or
    ``None`` (no transformers rows); ``plans`` from :func:`plan_rows`.
    """
    from executor.drafters import parse_drafter

    runners: dict = {}
    for dtype in config.dtypes:
        model, specs = targets[dtype]
        drafters = {label: parse_drafter(spec, model) for label, spec in specs.items()}
        for temperature in config.temperatures:
            planned = {
                p["drafter"]: p["parents"]
                for p in plans
                if (p["dtype"], p["temperature"]) == (dtype, float(temperature))
            }
            rows = _peer_rows(config, peers.get(dtype), temperature)
            rows.update(_our_rows(config, model, drafters, planned, temperature))
            for name, make in rows.items():
                if config.wants(name):
                    runners[RowKey(name, dtype, float(temperature))] = make()
    return runners


def llamacpp_runners(config: BenchConfig, load_llama, int8_target=None, plain_targets=None) -> dict:
    """``{RowKey: runner}`` of the llama.cpp rows and our extra plain-decoding rows (module docstring), at
    temperature 0 only.

    ``load_llama(weights, lookup)`` returns a ``llama_cpp.Llama`` (``lookup``: ``None`` for plain decoding,
    else the draft tokens ``K`` of its prompt lookup; :func:`experiments.peer_llamacpp.load_llama`);
    ``int8_target`` is our int8 model (``None``: no ``ar-int8`` row); ``plain_targets`` maps further row names
    (``ar-q4_1``, ``ar-eager``, ...) to our float32-activation models, each run by plain greedy decoding.
    """
    from executor.decoders import AutoregressiveDecoder, Sampling
    from experiments.peer_llamacpp import llamacpp_runner

    runners: dict = {}
    if 0.0 not in {float(t) for t in config.temperatures}:
        return runners
    for weights in config.peer_weights:
        for lookup in (None, *config.lookups):
            name = "llamacpp" if lookup is None else f"llamacpp-lookup-k{lookup}"
            if config.wants(name):
                key = RowKey(name, LLAMACPP_DTYPES[weights], 0.0)
                runners[key] = llamacpp_runner(load_llama(weights, lookup))
    plain = dict(plain_targets or {})
    if int8_target is not None:
        plain["ar-int8"] = int8_target
    for name, model in plain.items():
        if config.wants(name):
            decoder = AutoregressiveDecoder(model, sampling=Sampling(temperature=0.0))
            runners[RowKey(name, "float32", 0.0)] = our_runner(decoder)
    return runners


def _peer_rows(config: BenchConfig, peer, temperature: float) -> dict:
    """``{row name: runner factory}`` of the transformers rows (none without a peer)."""
    if peer is None:
        return {}
    model, tokenizer = peer
    pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    options = {"hf-generate": {}}
    options.update({f"hf-prompt-lookup-k{k}": {"prompt_lookup_num_tokens": k} for k in config.lookups})
    options["hf-early-exit"] = {"assistant_early_exit": config.exit_layer}
    return {name: partial(hf_runner, model, pad, temperature, extra) for name, extra in options.items()}


def _our_rows(config: BenchConfig, model, drafters: dict, planned: dict, temperature: float) -> dict:
    """``{row name: runner factory}`` of our decoders (module docstring) at ``temperature``."""
    from executor.decoders import (
        AutoregressiveDecoder,
        ChainDecoder,
        MultiDraftDecoder,
        Sampling,
        TreeDecoder,
        default_tree,
    )
    from executor.drafters import LookupFirstDrafter, PromptLookupDrafter
    from executor.drafters.parse import LOOKUP_MIN_NGRAM, LOOKUP_MODEL_TOKENS

    sampling = Sampling(temperature=temperature)
    gamma = config.gamma

    def ours(decoder_class, *args, **kwargs):
        return lambda: our_runner(decoder_class(model, *args, sampling=sampling, **kwargs))

    rows = {"ar": ours(AutoregressiveDecoder)}
    for k in config.lookups:
        rows[f"chain-ngram-g{k}"] = ours(ChainDecoder, PromptLookupDrafter(), gamma=k)
    for label, drafter in drafters.items():
        rows[f"chain-{label}"] = ours(ChainDecoder, drafter, gamma=gamma)
        lookup_first = LookupFirstDrafter(
            PromptLookupDrafter(min_ngram=LOOKUP_MIN_NGRAM), drafter, model_tokens=LOOKUP_MODEL_TOKENS
        )
        rows[f"chain-ngram+{label}"] = ours(ChainDecoder, lookup_first, gamma=max(gamma, *config.lookups))
        rows[f"tree-{label}"] = ours(TreeDecoder, drafter, tree=default_tree(drafter, gamma, 2))
        for verifier in ("argmax",) if temperature == 0 else config.verifiers:
            for n in config.ns:
                if verifier == "spechub" and n != 2:  # SpecHub is defined for two drafts only
                    continue
                rows[f"multidraft-{verifier}-n{n}-{label}"] = ours(
                    MultiDraftDecoder, drafter, n=n, verifier="rrs" if verifier == "argmax" else verifier
                )
        if label in planned:
            rows[f"plan-tree-{label}"] = ours(TreeDecoder, drafter, tree=planned[label])
    return rows
