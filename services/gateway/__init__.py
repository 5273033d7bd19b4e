"""Rollout gateway: token-id generation over a pool of engines (local CPU, vLLM, scripted)."""
