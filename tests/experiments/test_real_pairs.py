"""experiments.real_pairs on a tiny model: logged pairs are distributions, the CLI writes npz + valid JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.real_pairs import compress_pair, log_pairs, main
from tests.tiny_models import build_tiny_model

VOCAB = 16


class ByteTokenizer:
    """Each character to a token of the tiny vocabulary; decodes to letters."""

    eos_id = None

    def encode(self, text: str) -> list[int]:
        return [ord(c) % VOCAB for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(97 + i) for i in ids)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(0, vocab_size=VOCAB, max_seq_len=128), ByteTokenizer()


def test_logged_pairs_are_distributions_over_the_vocabulary(tiny):
    model, tokenizer = tiny
    p, q = log_pairs(
        1.0, drafter="early-exit:1", steps=3, prompts=("ab", "cd"), model=model, tokenizer=tokenizer
    )
    assert p.shape == q.shape and p.shape[1] == VOCAB and p.shape[0] >= 2
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(q.sum(axis=1), 1.0, atol=1e-12)
    assert (p >= 0).all() and (q >= 0).all() and not np.allclose(p, q)


def test_cli_writes_the_pairs_and_a_valid_json_summary(tiny, tmp_path, capsys):
    model, tokenizer = tiny
    out = tmp_path / "pairs.npz"
    argv = ["--temperature", "1.0", "--steps", "2", "--drafter", "early-exit:1", "--out", str(out)]
    assert main(argv, model=model, tokenizer=tokenizer) == 0
    data = np.load(out)
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["pairs"] == data["p"].shape[0] > 0 and report["vocab"] == VOCAB
    assert set(report["alpha_star_mean"]) == {"2", "4", "8"}
    assert 0.0 < report["alpha_star_mean"]["2"] <= report["alpha_star_mean"]["8"] <= 1.0
    assert "wrote" in capsys.readouterr().out
    assert not [path for path in tmp_path.iterdir() if path.name.startswith("tmp")]  # no temporary left


def test_cli_rejects_bad_arguments_naming_them(tiny, tmp_path):
    model, tokenizer = tiny
    with pytest.raises(SystemExit):
        main(["--steps", "0", "--out", str(tmp_path / "x.npz")], model=model, tokenizer=tokenizer)
    with pytest.raises(SystemExit):
        main(["--temperature", "0", "--out", str(tmp_path / "x.npz")], model=model, tokenizer=tokenizer)


def test_compress_pair_keeps_the_top_tokens_and_both_rests():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(50)), rng.dirichlet(np.ones(50))
    small_p, small_q = compress_pair(p, q, 5)
    keep = np.union1d(np.argsort(-p)[:5], np.argsort(-q)[:5])
    assert small_p.shape == (keep.size + 2,)
    np.testing.assert_allclose(small_p[:-2], p[keep])
    np.testing.assert_allclose(small_q[:-2], q[keep])
    assert small_p[-1] == 0.0 and small_q[-2] == 0.0
    np.testing.assert_allclose([small_p.sum(), small_q.sum()], 1.0)
