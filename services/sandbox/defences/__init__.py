"""Invariant 6's defences over files, applied by the backends (before the verifier, in the
sandbox's own view) and by a trial's verify phase: the test-runner configuration guard
(``runner_guard``), the verifier's routes guard (``path_guard``), git history squashing,
protected reward files and reward reading (``integrity``).

They stand below the backends, which apply them, and import only ``task/`` and ``common/``.
"""
