"""The theory computes exactly: an overflow or invalid value there is an unhandled edge case, not noise.

Every theory test turns numpy's RuntimeWarnings into errors, so that hypothesis shrinks the example and reports
it (two such warnings in CI led to real defects: a silently wrong without-replacement optimum, and a fit that
stopped 0.014 short of alpha* on a subnormal draft probability). Intended overflows sit in ``np.errstate``.
"""

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/theory/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.filterwarnings("error::RuntimeWarning"))
