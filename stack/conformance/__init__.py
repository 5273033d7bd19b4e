"""The conformance matrix behind ``harnessrl conformance``: the real harnesses, run against
a real proxy (``proxy_stack``), one driver per harness (``drivers``, ``openhands``; ``declared``
for the harnesses declared in TOML files), and the scenarios, cells and table (``matrix``)."""
