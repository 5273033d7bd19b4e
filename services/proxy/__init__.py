"""Token-faithful proxy: the OpenAI / Anthropic / Responses front that unmodified harnesses talk to."""
