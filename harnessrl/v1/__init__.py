"""Generated from proto/harnessrl/v1 by scripts/gen_protos.py. Do not edit."""
