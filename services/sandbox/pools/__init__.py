"""Task pool sources that write Harbor tasks (``swe``: SWE-bench-style records)."""
