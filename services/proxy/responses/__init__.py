"""OpenAI Responses (``/v1/responses``), what Codex speaks."""
