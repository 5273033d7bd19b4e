"""The ``harnessrl`` command line (also ``python -m stack.cli``): one module per command group
(``run``, ``trial``, ``tasks``, ``harness``, ``sandbox``, ``capture``, ``bench``, ``conformance``,
``verl``, ...), each a thin layer that parses arguments and calls the composition below it; the
top floor of ``stack/`` (docs/architecture.md, "Layers")."""
