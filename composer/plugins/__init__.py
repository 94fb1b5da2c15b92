"""composer's own backend plugins. Each registers through the ``composer`` entry points."""
