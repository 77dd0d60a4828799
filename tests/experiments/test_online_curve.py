"""experiments.online_curve: the online stream against the frozen control, on a tiny model."""

from __future__ import annotations

import random

from experiments.online_curve import online_curve, render_curve
from tests.tiny_models import build_tiny_model


def test_the_curve_serves_every_prompt_to_plain_frozen_and_online_decoding():
    model = build_tiny_model(3, vocab_size=8, n_layers=4, max_seq_len=96)
    rng = random.Random(1)
    prompts = [[rng.randrange(8) for _ in range(5)] for _ in range(6)]
    options = {"gamma": 3, "steps": 8, "lr": 1e-2, "window": 24}
    report = online_curve(model, None, prompts, max_new_tokens=24, options=options)
    rows = report["rows"]
    assert [row["served"] for row in rows] == [1, 2, 3, 4, 5, 6] and report["head"] == "untrained"
    assert all(row[label]["identical"] for row in rows for label in ("frozen", "online"))
    assert all(row["frozen"]["update_seconds"] == 0 for row in rows)
    assert all(row["online"]["update_seconds"] > 0 for row in rows)
    late = {label: sum(row[label]["acceptance"] for row in rows[3:]) for label in ("frozen", "online")}
    assert late["online"] > late["frozen"]
    text = render_curve(report)
    assert text.count("\n| ") == 6 and "second half" in text and "speedup vs plain decoding" in text
