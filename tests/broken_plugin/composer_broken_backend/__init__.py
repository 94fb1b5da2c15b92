"""A plugin that fails to import, as a plugin with a missing dependency does."""

import composer_dependency_that_is_not_installed  # noqa: F401
