import os
import warnings

import pytest


def pytest_configure(config):
    # The suite composes the same models with the same stacks many times: one cache for the
    # whole run (xdist workers included) and the next, off the user's own ~/.cache. Keys
    # carry a digest of composer's source, so an edit never meets what old code lowered.
    os.environ.setdefault(
        "COMPOSER_CACHE_DIR", str(config.rootpath / ".pytest_cache" / "composer-cache")
    )


@pytest.fixture(autouse=True)
def _quiet_upstream_warnings():
    # torch and ExecuTorch deprecation chatter is not ours; composer's own warnings are
    # UserWarnings and stay visible to pytest.warns.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield
