"""The plugin contract under the name third-party plugins import: ``from composer.contract.hookspecs
import hookimpl``. It lives in :mod:`composer.contract.hookspecs`."""

from composer.contract.hookspecs import *
from composer.contract.hookspecs import PROJECT_NAME, hookimpl, hookspec  # noqa: F401
