"""Tests of executor.files: atomic writes leave the whole file or the old one, never a temporary."""

import json

import pytest

from executor.files import write_json, write_text


def test_write_json_creates_the_directory_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "out" / "result.json"
    write_json({"tau": 1.5, "token_ids": [1, 2]}, path)
    assert json.loads(path.read_text()) == {"tau": 1.5, "token_ids": [1, 2]}
    assert list(path.parent.iterdir()) == [path]


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "report.md"
    write_text("old", path)
    with pytest.raises(TypeError):
        write_json({"not serialisable": object()}, path)
    assert path.read_text() == "old"
    assert list(tmp_path.iterdir()) == [path]
