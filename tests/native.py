"""Shared by the tests of native code: run it where it can be built, fail where it should have been."""

from __future__ import annotations

import os
import shutil

import pytest

from theory import _native


def require_native_code() -> None:
    """Skip (visibly) on a machine without a C++ compiler; fail where one exists but the native code is off."""
    if not (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler on this machine: the theory's native code is not offered")
    with _native.enabled(True):  # built whatever SPECBOUND_NATIVE says: the tests ask for it
        built = _native.available()
    if not built:
        pytest.fail("a C++ compiler is here but the theory's native code is off (stderr says why)")
