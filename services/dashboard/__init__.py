"""Dashboard: FastAPI backend and web UI over the capture store and trainer metrics."""
