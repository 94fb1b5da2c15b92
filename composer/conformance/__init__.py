"""ExecuTorch's own backend test suite (``executorch.backends.test.suite``), run through composer.

The suite ships in the ExecuTorch wheel and runs its operator and model tests over *flows*
(a backend and its tester). :mod:`composer.conformance.flows` makes flows from composer's
installed plugins, each beside the suite's plain flow of the same backends; composer's pytest
plugin puts them in the suite (``pytest --composer-flows=xnnpack,openvino+xnnpack``) and
``composer conformance`` runs it and prints one table per flow (:mod:`.results`).
"""
