"""experiments.peers: the errors before transformers loads anything (the loads themselves are the fidelity
tests' subject, tests/executor/test_fidelity.py)."""

import sys

import pytest

from experiments.peers import load_transformers_model, load_transformers_tokenizer

LOADERS = [load_transformers_model, load_transformers_tokenizer]


@pytest.mark.parametrize("load", LOADERS)
def test_a_missing_transformers_names_the_install_command(load, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'specbound\[peer\]'"):
        load()


@pytest.mark.parametrize("load", LOADERS)
def test_a_path_that_is_not_a_file_is_named(load, tmp_path):
    pytest.importorskip("transformers", reason="the path is checked after transformers is found")
    with pytest.raises(ValueError, match="is not a file"):
        load(tmp_path / "missing.gguf")
