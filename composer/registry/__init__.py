"""Finding backends and asking them: entry-point discovery, the registry's one method per hook,
every plugin answer checked (``answers``), the Stack."""
