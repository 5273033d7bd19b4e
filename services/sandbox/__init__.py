"""Sandbox service: runs Harbor-format trials with unmodified harnesses and reports rewards."""
