"""Errors a user can cause. Every message says what to do next."""


class ComposerError(Exception):
    """Base class: a problem with the model, the backend list, a plugin or a path."""


class BackendListError(ComposerError):
    """The priority list names an unknown backend, repeats one, or is empty."""


class PluginError(ComposerError):
    """A plugin failed to load, raised in a hook, or broke the plugin contract."""


class ModelError(ComposerError):
    """The model could not be loaded or exported."""


class PartitionError(ComposerError):
    """A partition is not convex, or the stacked program would contain a cycle."""


class ComposerWarning(UserWarning):
    """Something composer worked around (a plugin skipped, a tag removed); it says what."""
