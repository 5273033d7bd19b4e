"""harnessrl common package: settings, logging, telemetry, gRPC plumbing, generated stubs.

Services under ``services/`` import this package and the stubs in ``harnessrl.v1``,
never each other (``tests/unit/test_import_rules.py``).
"""

__version__ = "0.1.0"
