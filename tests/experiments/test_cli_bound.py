"""``specbound bound``: tables and JSON on the shipped example and on user files, and its error paths."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from experiments.cli import main
from experiments.commands.bound import EXAMPLE
from theory import verifier


def iid_optimum(p, q, n):
    """Independent oracle: SpecTr's bound 1 + min over ratio prefixes of [p(H) - q(H)^n]."""
    order = np.argsort(p / q)
    target = np.concatenate([[0.0], np.cumsum(p[order])])
    draft = np.concatenate([[0.0], np.cumsum(q[order])])
    return 1.0 + np.min(target - draft**n)


def run_json(capsys, *arguments):
    assert main(["bound", *arguments, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_example_is_reproduced_by_its_documented_script():
    spec = importlib.util.spec_from_file_location("make_example", EXAMPLE.with_name("make_example.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    p, q = module.example_pair()
    # Not bit for bit: numpy's exp and sums are vectorised differently per CPU (AVX-512 or not), which moves
    # entries by a few ulp (exp) and the softmax denominator by ~log2(V) ulp. rtol 1e-12 is ~4000 ulp, far
    # above that rounding and far below anything the CLI prints (6 decimals); a different seed or formula
    # changes entries by O(1).
    with np.load(EXAMPLE) as archive:
        np.testing.assert_allclose(archive["p"], p, rtol=1e-12, atol=0)
        np.testing.assert_allclose(archive["q"], q, rtol=1e-12, atol=0)
    assert p.shape == (1000,) and p.max() > 0.3 and 0.3 < np.minimum(p, q).sum() < 0.9


def test_example_table_lists_every_draft_law_and_verifier(capsys):
    assert main(["bound", "--example"]) == 0
    out = capsys.readouterr().out
    with np.load(EXAMPLE) as archive:
        p, q = archive["p"], archive["q"]
    assert "V = 1000, n = 4" in out
    assert f"iid        {iid_optimum(p, q, 4):.6f}" in out
    for name in ("nss", "naive", "rrs", "rrs_wor", "kseq", "spechub", "greedy", "optimal"):
        assert any(line.startswith(f"{name} ") for line in out.splitlines()), name
    assert "n/a (exact method needs V <= 70 for n = 4)" in out  # RRS-wor at n = 4 is refused, not run
    assert "n/a (SpecHub needs n = 2)" in out
    greedy_line = next(line for line in out.splitlines() if line.split()[:2] == ["greedy", "greedy"])
    assert greedy_line.split()[-1] == "1.0000"  # greedy attains its own optimum


def test_example_json_values_match_the_theory(capsys):
    result = run_json(capsys, "--example", "-n", "2")
    with np.load(EXAMPLE) as archive:
        p, q = archive["p"], archive["q"]
    assert result["n"] == 2 and result["rows"] == 1 and result["vocab_size"] == 1000
    assert result["optimal"]["iid"]["mean"] == pytest.approx(iid_optimum(p, q, 2), abs=1e-12)
    for name in ("rrs", "rrs_wor", "kseq", "spechub", "greedy"):
        entry = result["verifiers"][name]
        assert entry["acceptance"]["mean"] == pytest.approx(verifier(name).acceptance(p, q, 2), abs=1e-12)
        assert 0 < entry["efficiency"] <= 1 + 1e-9
    assert result["verifiers"]["spechub"]["efficiency"] == pytest.approx(1.0, abs=1e-9)
    assert result["verifiers"]["optimal"]["efficiency"] == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("suffix", [".npy", ".txt", ".json"])
def test_files_in_every_format_give_the_same_answer(tmp_path, capsys, suffix):
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
    paths = []
    for name, vector in (("p", p), ("q", q)):
        path = tmp_path / f"{name}{suffix}"
        if suffix == ".npy":
            np.save(path, vector)
        elif suffix == ".json":
            path.write_text(json.dumps(vector.tolist()))
        else:
            path.write_text(" ".join(repr(float(x)) for x in vector))
        paths.append(str(path))
    result = run_json(capsys, "--p", paths[0], "--q", paths[1], "-n", "2", "--draft", "iid", "wor")
    assert list(result["optimal"]) == ["iid", "wor"]
    assert result["verifiers"]["rrs"]["acceptance"]["mean"] == pytest.approx(1 - 0.3 * 0.8, abs=1e-12)
    assert result["verifiers"]["spechub"]["acceptance"]["mean"] == pytest.approx(0.9, abs=1e-12)


def test_batch_reports_means_and_per_row_values(tmp_path, capsys):
    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.ones(6), size=3), rng.dirichlet(np.ones(6), size=3)
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "q.npy", q)
    arguments = ["--p", str(tmp_path / "p.npy"), "--q", str(tmp_path / "q.npy"), "-n", "3"]
    result = run_json(capsys, *arguments)
    rows = [verifier("rrs_wor").acceptance(p[i], q[i], 3) for i in range(3)]
    entry = result["verifiers"]["rrs_wor"]
    np.testing.assert_allclose(entry["acceptance"]["per_row"], rows, atol=1e-12)
    assert entry["acceptance"]["mean"] == pytest.approx(np.mean(rows), abs=1e-12)
    assert result["rows"] == 3 and len(result["optimal"]["wor"]["per_row"]) == 3
    assert main(["bound", *arguments]) == 0
    assert "3 pairs (means over rows)" in capsys.readouterr().out


def test_inline_json_gives_the_answer_of_a_file(tmp_path, capsys):
    np.save(tmp_path / "p.npy", np.array([0.5, 0.3, 0.2]))
    np.save(tmp_path / "q.npy", np.array([0.2, 0.3, 0.5]))
    from_files = run_json(capsys, "--p", str(tmp_path / "p.npy"), "--q", str(tmp_path / "q.npy"), "-n", "2")
    inline = run_json(capsys, "--p", "[0.5, 0.3, 0.2]", "--q", "[0.2, 0.3, 0.5]", "-n", "2")
    assert inline == from_files
    assert inline["verifiers"]["rrs"]["acceptance"]["mean"] == pytest.approx(1 - 0.3 * 0.8, abs=1e-12)


def test_several_draft_counts_give_one_table_each_in_order(capsys):
    results = run_json(capsys, "--example", "-n", "2", "3", "2")  # a repeated count is shown once
    assert [result["n"] for result in results] == [2, 3]
    for result in results:
        assert result == run_json(capsys, "--example", "-n", str(result["n"]))
    assert main(["bound", "--example", "-n", "2", "3"]) == 0
    out = capsys.readouterr().out
    assert out.index("V = 1000, n = 2") < out.index("V = 1000, n = 3")


def test_a_law_that_cannot_draw_n_distinct_drafts_is_a_cell_note_not_an_error(capsys):
    result = run_json(capsys, "--p", "[0.6, 0.4]", "--q", "[0.5, 0.5]", "-n", "3")
    note = "n/a (n distinct drafts; q has 2 tokens > 0)"
    assert result["optimal"]["wor"] == {"note": note} and result["verifiers"]["rrs_wor"]["note"] == note
    assert result["optimal"]["greedy"] == {"note": note}
    # The i.i.d. law draws repeats, so its cells are computed.
    p, q = np.array([0.6, 0.4]), np.array([0.5, 0.5])
    assert result["optimal"]["iid"]["mean"] == pytest.approx(iid_optimum(p, q, 3), abs=1e-12)
    assert result["verifiers"]["rrs"]["acceptance"]["mean"] == pytest.approx(
        verifier("rrs").acceptance(p, q, 3), abs=1e-12
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--p", "missing.npy", "--q", "missing.npy"], "--p: cannot read missing.npy: no such file"),
        (["--p", "[0.5, 0.5", "--q", "{q}"], "not inline JSON either"),
        (["--p", '[0.5, "x"]', "--q", "{q}"], "--p: '[0.5, \"x\"]' is not a list of numbers"),
        (["--p", "{dir}", "--q", "{q}"], "is not a file"),
        (["--p", "{p}"], "give both --p and --q"),
        ([], "give both --p and --q"),
        (["--example", "--p", "{p}"], "do not combine"),
        (["--p", "{bad}", "--q", "{q}"], "p must sum to 1"),
        (["--p", "{p}", "--q", "{short}"], "share the vocabulary"),
        (["--p", "{p}", "--q", "{q}", "-n", "0"], "n must be at least 1"),
        (["--p", "{text}", "--q", "{q}"], "--p: cannot read"),
        (["--example", "--out", "report"], "--out apply to --logs only"),
        (["--example", "--workers", "0", "--no-progress"], "--workers, --no-progress apply to --logs only"),
        (
            ["--p", "{p}", "--q", "{q}", "--verifiers", "rrs", "--wor-low", "iid"],
            "--verifiers, --wor-low apply",
        ),
    ],
)
def test_errors_exit_with_status_two_and_a_one_line_message(tmp_path, capsys, arguments, message):
    files = {
        "p": [0.5, 0.5, 0.0],
        "q": [0.2, 0.3, 0.5],
        "bad": [0.5, 0.6, 0.2],
        "short": [0.5, 0.5],
    }
    for name, vector in files.items():
        np.save(tmp_path / f"{name}.npy", np.array(vector))
    (tmp_path / "text.txt").write_text("0.5 zero 0.5")
    lookup = {f"{{{name}}}": str(tmp_path / f"{name}.npy") for name in files}
    lookup["{text}"] = str(tmp_path / "text.txt")
    lookup["{dir}"] = str(tmp_path)
    assert main(["bound", *[lookup.get(a, a) for a in arguments]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specbound bound: error:") and message in err and "\n" not in err
