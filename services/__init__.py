"""harnessrl services. Each deploys on its own and imports only ``harnessrl``
(common package and ``harnessrl.v1`` stubs), never another service."""
