"""The Harbor task format: what a task *is*, read and checked, usable on its own.

Open this room to change how one Harbor field is read. ``model`` (task.toml and the task
folder, ``load_task``), ``steps`` (``[[steps]]``), ``harbor_fields`` (every field: honoured,
differs on purpose, or refused by name; ``harbor_check`` reports a task against it),
``compose`` and ``compose_env`` (``environment/docker-compose.yaml`` and its variables),
``dockerfile`` and ``dockerignore`` (the readers the backends build from), the declared
parts of ``artifacts`` and ``healthcheck``, ``agent_extras`` (skills and MCP servers) and
``verifier_policy`` (who runs ``tests/test.sh`` with what network, decided from the task).

It imports only ``common/``: no backend, no runner, nothing that runs a task.
"""
