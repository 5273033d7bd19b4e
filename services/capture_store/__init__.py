"""Capture store: durable token-level trajectories (Redis + S3, or embedded SQLite + files)."""
