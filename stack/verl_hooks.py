"""The module name users' launch scripts give verl (``VERL_USE_EXTERNAL_MODULES=stack.verl_hooks``):
kept stable; importing it registers the hooks of ``stack/verl/hooks.py``."""

from stack.verl import hooks as _hooks  # noqa: F401  (imported for its registrations)
