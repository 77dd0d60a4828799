"""experiments.bench_lookup_first on a tiny random model (seconds): every configuration is built and measured."""

from executor.decoders import Sampling
from executor.drafters import EarlyExitDrafter, LookupFirstDrafter
from experiments.bench_lookup_first import decoders, measure
from tests.tiny_models import build_tiny_model


def test_every_setting_pair_is_built_and_measured_against_plain_decoding():
    model = build_tiny_model(3, vocab_size=24, n_layers=3, max_seq_len=96)
    built = decoders(model, EarlyExitDrafter(model, 1), Sampling(temperature=0.0))
    combined = {
        name: d.drafter
        for name, d in built.items()
        if isinstance(getattr(d, "drafter", None), LookupFirstDrafter)
    }
    assert {(d.lookup.min_ngram, d.model_tokens) for d in combined.values()} == {
        (m, k) for m in (1, 2, 3) for k in (1, 2, 3)
    }
    table = measure(built, [[3, 1, 4, 1, 5, 3, 1], [2, 7, 1, 8, 2, 7]], 6)
    assert set(table) == set(built)
    assert table["ar"]["vs_ar"] == 1.0 and table["ar"]["tau"] == 1.0
    assert all(row["tau"] >= 1.0 and row["tokens_per_s"] > 0 for row in table.values())
