"""The plugin contract under the name third-party plugins import: ``from composer.hookspecs
import hookimpl, BackendPlugin``. It lives in :mod:`composer.contract.hookspecs`."""

from composer.contract.hookspecs import *
from composer.contract.hookspecs import (  # noqa: F401
    PROJECT_NAME,
    BackendPlugin,
    hookimpl,
    hookspec,
)
