"""The ground every room of the sandbox stands on: its error types (``errors``), the
directory layout of a sandbox and a trial (``paths``), the settings models (``settings``),
safe tar unpacking (``tarsafe``) and the Unix-socket relay to the proxy (``relay``). It
imports nothing else of the sandbox."""
