import warnings

import pytest


@pytest.fixture(autouse=True)
def _quiet_upstream_warnings():
    # torch and ExecuTorch deprecation chatter is not ours; composer's own warnings are
    # UserWarnings and stay visible to pytest.warns.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield
