"""``specbound profile`` on a tiny model: the JSON it writes, its use by plan-tree/plan-length, bad input."""

from __future__ import annotations

import json

import pytest

import experiments.commands.profile as profile_command
from executor.quantize import quantize_model
from experiments.cli import main
from experiments.profiling import PROFILE_FORMAT, PROFILE_VERSION
from tests.tiny_models import build_tiny_model


class ByteTokenizer:
    """Maps each character to a token of the tiny vocabulary (enough to build a context)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [ord(c) % self.vocab_size for c in text]


@pytest.fixture
def tiny_target(monkeypatch):
    loaded = []

    def load_target(source, dtype, quantize=None):
        model = build_tiny_model(0, vocab_size=16, max_seq_len=64).to(dtype)
        loaded.append(dtype)
        return (quantize_model(model, quantize) if quantize else model), ByteTokenizer(16)

    monkeypatch.setattr(profile_command, "load_target", load_target)
    return loaded


def profile(tmp_path, *extra) -> dict:
    out = tmp_path / "latency.json"
    argv = ["profile", "--context", "24", "--max-size", "8", "--max-width", "4", "--repeats", "3"]
    argv += ["--warmup", "1", "--threads", "1", "--out", str(out), *extra]
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_profile_writes_the_documented_json(tmp_path, tiny_target, capsys):
    data = profile(tmp_path, "--drafter", "early-exit:1", "--dtype", "float32")
    assert (data["format"], data["version"], data["dtype"], data["threads"]) == (
        PROFILE_FORMAT,
        PROFILE_VERSION,
        "float32",
        1,
    )
    assert data["target"]["sizes"] == [1, 2, 4, 8]
    assert data["drafter"]["per_level"]["widths"] == [1, 2, 4] and data["drafter"]["name"] == "early-exit:1"
    assert data["context_tokens"] == 24 and set(data["hardware"]) >= {"cuda", "cpu_native_bf16"}
    assert "new tokens" in capsys.readouterr().out


def test_bfloat16_and_no_drafter(tmp_path, tiny_target):
    import torch

    data = profile(tmp_path, "--drafter", "none", "--dtype", "bfloat16")
    assert data["dtype"] == "bfloat16" and tiny_target == [torch.bfloat16]
    assert data["drafter"] is None


def test_int8_profile_records_the_quantisation(tmp_path, tiny_target, capsys):
    data = profile(tmp_path, "--drafter", "early-exit:1", "--dtype", "float32", "--quantize", "int8")
    assert (data["dtype"], data["quantize"]) == ("float32", "int8")
    assert "(int8 weights)" in capsys.readouterr().out
    assert profile(tmp_path, "--drafter", "none")["quantize"] == "none"


def test_plan_tree_and_plan_length_accept_the_profile(tmp_path, tiny_target, capsys):
    data = profile(tmp_path, "--drafter", "early-exit:1")
    latency = str(tmp_path / "latency.json")
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps([0.6, 0.2, 0.1]))
    capsys.readouterr()
    assert main(["plan-tree", "--acceptance", str(acc), "--budget", "8", "--latency", latency, "--json"]) == 0
    tree = json.loads(capsys.readouterr().out)
    assert tree["draft_time"] == data["drafter"]["level_time"] and 1 <= tree["size"] <= 8
    alpha = tmp_path / "alpha.json"
    alpha.write_text("0.7")
    assert main(["plan-length", "--acceptance", str(alpha), "--latency", latency, "--json"]) == 0
    length = json.loads(capsys.readouterr().out)
    assert length["costs"]["draft_time"] == data["drafter"]["draft_time"]
    assert 1 <= length["latency"]["cap"] <= 7


@pytest.fixture
def fake_compile(monkeypatch):
    """``torch.compile`` replaced by a wrapper that counts calls (Inductor itself is tested in
    tests/executor/test_compiled.py): what the commands' ``--compile`` plumbing does, not how fast it is."""
    import torch

    from executor import compiled

    calls = []

    def compile_(function, **options):
        def step(*args):
            calls.append(args[0].shape[1])  # the number of new tokens of the forward
            return function(*args)

        return step

    monkeypatch.setattr(compiled, "compiler_available", lambda: True)
    monkeypatch.setattr(torch, "compile", compile_)
    return calls


def test_compile_times_the_compiled_step_and_reports_compile_time_apart(
    tmp_path, tiny_target, fake_compile, capsys
):
    data = profile(tmp_path, "--drafter", "none", "--compile")
    assert data["compiled"] is True and data["compile_seconds"] >= 0
    # The warm-up ran every size first, then every timed forward went through the compiled step.
    warmed = fake_compile[: 1 + len(data["target"]["sizes"])]
    assert warmed == [16, *data["target"]["sizes"]]
    assert len(fake_compile) > len(warmed) and set(fake_compile[len(warmed) :]) >= {1, 2, 4, 8}
    assert "compiled (compile" in capsys.readouterr().out
    # plan-length reads the compiled profile like any other.
    alpha = tmp_path / "alpha.json"
    alpha.write_text("0.7")
    latency = str(tmp_path / "latency.json")
    assert (
        main(["plan-length", "--acceptance", str(alpha), "--latency", latency, "--draft-time", "0.001"]) == 0
    )
    # Without --compile nothing is compiled (negative control), and without a compiler the run stays eager.
    fake_compile.clear()
    assert profile(tmp_path, "--drafter", "none")["compiled"] is False and fake_compile == []


def test_compile_flushes_subnormals_during_the_run_only(tmp_path, tiny_target, fake_compile, monkeypatch):
    import torch

    subnormal = torch.tensor([1e-40], dtype=torch.float32)  # below float32's smallest normal, 1.2e-38
    seen = []
    load = profile_command.load_target

    def load_target(*args, **kwargs):
        seen.append(float(subnormal * 1.0))  # 0 when the CPU flushes subnormals
        return load(*args, **kwargs)

    monkeypatch.setattr(profile_command, "load_target", load_target)
    profile(tmp_path, "--drafter", "none")
    profile(tmp_path, "--drafter", "none", "--compile")
    # Inductor's CPU kernels are 5-50x slower on subnormals: --compile flushes them, from before the model
    # loads (torch's worker threads copy the setting when they start), and only for the command's run.
    assert seen[0] != 0.0 and seen[1] == 0.0
    assert float(subnormal * 1.0) != 0.0


def test_compile_without_a_compiler_profiles_the_eager_model_and_says_so(
    tmp_path, tiny_target, monkeypatch, capsys
):
    from executor import compiled

    monkeypatch.setattr(compiled, "compiler_available", lambda: False)
    data = profile(tmp_path, "--drafter", "none", "--compile")
    assert data["compiled"] is False and data["compile_seconds"] is None
    assert "running the model eagerly" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-size", "48"], "--max-size must be a power of two"),
        (["--max-width", "0"], "--max-width must be a power of two"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--warmup", "-1"], "--warmup must be non-negative"),
        (["--context", "1"], "--context must be at least 2"),
        (["--drafter", "bogus"], "--drafter: unknown drafter 'bogus'"),
        (["--drafter", "early-exit:7"], "exit_layer must be below"),
        (["--threads", "0"], "--threads must be an integer >= 1"),
        (["--context", "60"], "the model's context is 64"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(tmp_path, tiny_target, capsys, argv, message):
    assert main(["profile", "--out", str(tmp_path / "x.json"), "--max-size", "8", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_bad_dtype_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--dtype", "float16"])
    assert "invalid choice: 'float16'" in capsys.readouterr().err
