"""Tests of executor.files: atomic writes leave the whole file or the old one, never a temporary."""

import json
import os
import stat

import numpy as np
import pytest

from executor.files import atomic_path, write_bytes, write_json, write_text


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


def _umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def test_written_files_follow_the_umask_like_any_new_file(tmp_path):
    """mkstemp makes its files 0o600; a result or cache file must follow the umask like any new file."""
    expected = 0o666 & ~_umask()
    for write, data in ((write_text, "text"), (write_bytes, b"bytes"), (write_json, {"a": 1})):
        path = tmp_path / f"{write.__name__}.out"
        write(data, path)
        assert stat.S_IMODE(path.stat().st_mode) == expected
    plain = tmp_path / "plain"
    plain.write_text("x")  # what open() gives under the same umask
    assert stat.S_IMODE(plain.stat().st_mode) == expected


def test_atomic_path_hands_writers_a_temporary_with_their_suffix_and_cleans_up_on_failure(tmp_path):
    path = tmp_path / "pairs.npz"
    with atomic_path(path, suffix=".npz") as temporary:
        assert temporary.parent == tmp_path and temporary.name.endswith(".npz") and temporary != path
        np.savez(temporary, p=np.arange(3))  # np.savez appends .npz to names without it
    assert sorted(tmp_path.iterdir()) == [path]
    np.testing.assert_array_equal(np.load(path)["p"], np.arange(3))
    with pytest.raises(RuntimeError), atomic_path(path, suffix=".npz") as temporary:
        temporary.write_bytes(b"half")
        raise RuntimeError("interrupted")
    assert sorted(tmp_path.iterdir()) == [path]
    np.testing.assert_array_equal(np.load(path)["p"], np.arange(3))


def test_only_durable_writes_reach_the_disk_before_the_rename(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda descriptor: synced.append(descriptor) or real_fsync(descriptor))
    write_bytes(b"checkpoint", tmp_path / "weights")
    assert len(synced) == 1
    write_text("report", tmp_path / "report.md")
    write_bytes(b"scratch", tmp_path / "scratch", durable=False)
    assert len(synced) == 1
