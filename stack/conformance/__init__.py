"""The conformance matrix behind ``harnessrl conformance``: the real harnesses, run against
a real proxy (``proxy_stack``), one driver per harness (``drivers``; ``openhands_driver``, the
script the OpenHands venv runs; ``declared`` for the harnesses declared in TOML files), and
the scenarios, cells and table (``matrix``)."""
