"""Self-distillation corpus: continuations sampled from the target itself, added to the training text.

``--corpus self:N`` (``train_drafter(corpus="self:N")``) trains on ``N`` tokens the target generated at
temperature 1, *followed by* the standard-library training chunks (the default corpus: its cached features are
reused), the generated chunks drawn :data:`OVERSAMPLE` times as often. Held-out figures stay on the standard
library's held-out files, so the two corpora are compared on the same held-out text. Rationale: at drafting time
the head reads text the target writes, not text people wrote; sampling at T = 1 (not greedy) keeps the target's
whole distribution in the inputs (Online Speculative Decoding, Liu et al., ICML 2024, arXiv 2310.07177, and
Medusa-2's self-distillation, Cai et al., ICML 2024, arXiv 2401.10774, train on the target's own outputs).

**Starts** (HumanEval is never read): three in four batches start from a ``code_prompt_tokens``-token window of a
standard-library *training* file (the window's offset is fixed by the file's path hash), one in four from one of
the prose openers below (written for this module, unlike any evaluation prompt in
:mod:`experiments.prompts`), cut to ``prose_prompt_tokens`` tokens.

**Generation** is batched (``batch_size`` rows share positions, so one forward per new token), at T = 1 with a
seeded generator per batch (batch ``i`` uses seed ``seed + i``: a resumed run draws exactly what an uninterrupted
one would). Each batch's rows are appended to a JSONL file under ``$XDG_CACHE_HOME/specbound/selfdistill/``
(rewritten atomically), so an interrupted run resumes at the next batch; rows are cut after the first EOS.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import torch

from executor.files import write_bytes
from executor.training.checkpoint import cache_root, model_fingerprint
from executor.training.features import MANIFEST, FeatureSet, build_features, load_features

__all__ = [
    "OVERSAMPLE",
    "PROSE_OPENERS",
    "chunk_sequences",
    "generate_continuations",
    "merge_features",
    "parse_self_corpus",
    "self_distilled_features",
]

#: How many times a generated chunk is repeated in the training set (the generated text is a small share).
OVERSAMPLE = 3

PROSE_OPENERS = (
    "Nobody remembers exactly when the lighthouse on the northern cape was built, but the oldest record is",
    "When we first moved to the city, the thing that surprised me most was how quiet the mornings",
    "Photosynthesis is the process by which green plants use sunlight to turn water and carbon dioxide",
    "Following up on the proposal discussed at last week's board session, the committee has agreed that",
    "The recipe calls for two cups of flour, a pinch of salt and butter that has been left out",
    "In the late nineteenth century, railways changed the way small towns traded with each other because",
    "Most people think of glaciers as frozen and still, but in fact they move slowly downhill under",
    "The meeting was supposed to start at nine, but by half past the only person in the room was",
    "A good night's sleep matters for memory: during deep sleep the brain replays what it learned",
    "Our village market opens every Saturday, and the stalls sell honey, cheese, bread and vegetables",
    "The author argues that the economy of the region depended less on gold than on the salt trade",
    "To change a flat tyre, first make sure the car is parked on level ground and the handbrake is",
    "She opened the old letter carefully, unsure whether she really wanted to know what it said about",
    "Volcanic islands form when magma rises through the ocean floor and cools into new rock, layer",
    "The museum's new exhibition brings together maps, diaries and instruments from early voyages",
    "In this chapter we describe how the survey was designed, who answered it and what we learned",
)


def parse_self_corpus(corpus) -> int | None:
    """``N`` for ``"self:N"`` (a positive integer number of generated tokens), ``None`` for anything else."""
    if not (isinstance(corpus, str) and corpus.startswith("self:")):
        return None
    value = corpus.removeprefix("self:")
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"corpus 'self:N' needs a positive integer number of tokens N; got {corpus!r}")
    return int(value)


def _code_starts(tokenizer, prompt_tokens: int):
    """``prompt_tokens``-token windows of the default corpus's training files, one per file and pass, without end.

    Pass 0 takes each file's window at the offset the hash of its path gives; pass ``k > 0`` at the hash of the
    path and ``k``, so a request larger than one pass (about 64 k code tokens on Python 3.11's standard library)
    goes over the same files again with other windows instead of running out of starts. Files too short for a
    window with room after it are skipped; a corpus without any is a ``ValueError``.
    """
    from executor.training.corpus import default_corpus

    for rank in itertools.count():
        found = False
        # Tokenized again on each pass: holding every file's ids would cost more memory than it saves time.
        for doc_id, text in default_corpus().train:
            ids = tokenizer.encode(text)
            span = len(ids) - 2 * prompt_tokens
            if span <= 0:  # too short for a window with room after it (span 0 would divide by zero below)
                continue
            found = True
            salt = b"start:" if rank == 0 else f"start:{rank}:".encode()
            offset = int.from_bytes(hashlib.sha256(salt + doc_id.encode()).digest()[:8], "big") % span
            label = f"code:{doc_id}" if rank == 0 else f"code:{doc_id}#{rank}"
            yield label, ids[offset : offset + prompt_tokens]
        if not found:
            raise ValueError(
                f"no training file of the default corpus is long enough for a {prompt_tokens}-token start "
                "with room after it"
            )


def _starts(tokenizer, batch: int, batch_size: int, code, settings: dict):
    """The ``batch``-th batch of starts: prose for every fourth batch, else the next code windows."""
    if batch % 4 == 3:
        openers = [
            PROSE_OPENERS[(batch // 4 * batch_size + row) % len(PROSE_OPENERS)] for row in range(batch_size)
        ]
        cut = settings["prose_prompt_tokens"]
        return [(f"prose:{batch}:{row}", tokenizer.encode(text)[:cut]) for row, text in enumerate(openers)]
    return [next(code) for _ in range(batch_size)]


def _cache_file(target, settings: dict) -> Path:
    key = json.dumps({"target": model_fingerprint(target)["hash"], **settings}, sort_keys=True)
    return cache_root() / "selfdistill" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsonl"


@torch.no_grad()
def _sample_batch(target, starts: list[list[int]], new_tokens: int, generator) -> list[list[int]]:
    device = target.tok_embeddings.weight.device
    prompt = torch.tensor(starts, device=device)
    rows, length = prompt.shape
    target.setup_cache(length + new_tokens, batch_size=rows)
    logits = target(prompt, torch.arange(length, device=device))[:, -1]
    out = []
    for i in range(new_tokens):
        probs = logits.float().softmax(-1).cpu()
        token = torch.multinomial(probs, 1, generator=generator)
        out.append(token)
        if i + 1 < new_tokens:
            logits = target(token.to(device), torch.tensor([length + i], device=device))[:, -1]
    return torch.cat(out, 1).tolist()


def generate_continuations(
    target,
    tokenizer,
    tokens: int,
    *,
    code_prompt_tokens: int = 48,
    prose_prompt_tokens: int = 12,
    new_tokens: int = 96,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = True,
) -> tuple[list[list[int]], Path]:
    """Generate (or resume) until ``tokens`` new tokens exist; returns ``(start + continuation ids, cache file)``."""
    from tqdm import tqdm

    settings = {
        "code_prompt_tokens": code_prompt_tokens,
        "prose_prompt_tokens": prose_prompt_tokens,
        "new_tokens": new_tokens,
        "batch_size": batch_size,
        "seed": seed,
    }
    path = _cache_file(target, settings)
    records = []
    if path.is_file():
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    eos = getattr(tokenizer, "eos_id", None)
    code = _code_starts(tokenizer, code_prompt_tokens)
    batches_done = len(records) // batch_size
    records = records[: batches_done * batch_size]  # a partial batch never happens (atomic writes); be safe
    for batch in range(batches_done):  # advance the code-start iterator past the finished batches
        _starts(tokenizer, batch, batch_size, code, settings)
    generated = sum(record["generated"] for record in records)
    with tqdm(
        total=tokens,
        initial=min(generated, tokens),
        unit="tok",
        desc="self-distillation",
        disable=not progress,
    ) as bar:
        batch = batches_done
        while generated < tokens:
            starts = _starts(tokenizer, batch, batch_size, code, settings)
            generator = torch.Generator().manual_seed(seed + batch)
            continuations = _sample_batch(target, [ids for _, ids in starts], new_tokens, generator)
            for (start_id, ids), continuation in zip(starts, continuations, strict=True):
                if eos is not None and eos in continuation:
                    continuation = continuation[: continuation.index(eos) + 1]
                records.append({"start": start_id, "ids": ids + continuation, "generated": len(continuation)})
                generated += len(continuation)
            text = "".join(json.dumps(record) + "\n" for record in records)
            write_bytes(text.encode("utf-8"), path)
            bar.update(min(generated, tokens) - bar.n)
            batch += 1
    used, count = [], 0
    for record in records:  # only what was asked: a larger cache from an earlier run serves a smaller N
        if count >= tokens:
            break
        used.append(record["ids"])
        count += record["generated"]
    return used, path


def chunk_sequences(sequences: list[list[int]], eos_id: int | None, chunk_length: int) -> list[list[int]]:
    """Consecutive ``chunk_length`` windows of the sequences joined with ``eos_id`` (the last partial dropped)."""
    buffer = [
        token
        for ids in sequences
        for token in ids + ([eos_id] if eos_id is not None and ids[-1] != eos_id else [])
    ]
    return [buffer[i : i + chunk_length] for i in range(0, len(buffer) - chunk_length + 1, chunk_length)]


def self_distilled_features(
    target, tokenizer, tokens: int, *, chunk_length: int = 512, progress: bool = True
) -> tuple[FeatureSet, dict]:
    """The target's features on ``tokens`` generated tokens (generated and prefilled once, cached)."""
    sequences, path = generate_continuations(target, tokenizer, tokens, progress=progress)
    chunks = chunk_sequences(sequences, getattr(tokenizer, "eos_id", None), chunk_length)
    if not chunks:
        raise ValueError(f"self:{tokens} gives fewer than {chunk_length} tokens; ask for more")
    directory = path.with_suffix(f".features-{chunk_length}-{len(chunks)}")  # N changes the chunks
    if not (directory / MANIFEST).is_file():
        earlier = sorted(path.parent.glob(f"{path.stem}.features-{chunk_length}-*"))  # same prefix of chunks
        build_features(target, {"train": chunks}, directory, progress=progress, reuse=earlier)
    info = {
        "self_distill_tokens": tokens,
        "sequences": len(sequences),
        "chunks": len(chunks),
        "oversample": OVERSAMPLE,
        "cache": str(path),
        "generation_key": path.stem,  # hashes the target and the generation settings (starts, lengths, seed)
    }
    return load_features(directory, "train"), info


def merge_features(generated: FeatureSet, base: FeatureSet, repeat: int = OVERSAMPLE) -> FeatureSet:
    """``generated`` (repeated ``repeat`` times) followed by ``base``: one training set."""
    return FeatureSet(
        tokens=torch.cat([generated.tokens] * repeat + [base.tokens]),
        hidden=torch.cat([generated.hidden] * repeat + [base.hidden]),
        topk_counts=generated.topk_counts + base.topk_counts,
    )
