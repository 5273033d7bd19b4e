"""Trainer: GRPO/GSPO/PPO on captured segments, async with bounded staleness."""
