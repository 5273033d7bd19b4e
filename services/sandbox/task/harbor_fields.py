"""Every field of Harbor's task schema and what harnessrl does with it: one table.

``services.sandbox.task.model`` refuses a task from this table (a field whose rule says
so, by name and why), warns about keys Harbor's schema lacks (Harbor ignores them,
so refusing would reject tasks Harbor runs) and ``docs/harbor.md`` is rendered from
it (``python -m services.sandbox.task.harbor_fields --write docs/harbor.md``), so the
code, the check command and the documentation cannot disagree.

Facts about Harbor are from the PyPI package ``harbor`` 0.26 (``models/task/config.py``,
``environments/docker``, ``verifier/verifier.py``), schema versions 1.0-1.4.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from services.sandbox.task import harbor_notes
from services.sandbox.task import steps as task_steps


class Status(StrEnum):
    SUPPORTED = "supported"  # honoured with Harbor's meaning
    MAPPED = "mapped"  # runs, with a meaning that differs on purpose (the note says how)
    REFUSED = "refused"  # a task that sets it is refused by name


# A refusal test: the reason a value is refused, or None when it runs.
Refuse = Callable[[Any], str | None]


@dataclass(frozen=True)
class Rule:
    status: Status
    note: str
    refuse: Refuse | None = None  # for supported/mapped fields refused only for some values


SECTIONS = ("task", "verifier", "agent", "environment", "solution")

# Harbor resolves a whole value of this form from the host's environment.
_HOST_TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")


def is_set(value: Any) -> bool:
    """Harbor treats None, empty strings, lists and tables as absent."""
    return value not in (None, "", [], {})


def _host_templates(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    names = sorted(k for k, v in value.items() if isinstance(v, str) and _HOST_TEMPLATE.fullmatch(v))
    if not names:
        return None
    return (
        f"{', '.join(names)}: '${{VAR}}' values are read from the host's environment in Harbor; harnessrl "
        "never passes the worker's environment into a sandbox (it holds credentials): write the value itself"
    )


def _not_linux(value: Any) -> str | None:
    if isinstance(value, str) and value.lower() != "linux":
        return f"only 'linux' tasks run here (bubblewrap and Linux containers), got {value!r}"
    return None


def _gpus(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return f"GPU tasks are not supported by the sandbox service (got {value})"
    return None


def _separate(value: Any) -> str | None:
    if value == "separate":
        return "only environment_mode = 'shared' is supported: the verifier runs in the agent's sandbox"
    return None


_USER = (
    "not supported yet: every phase runs as the sandbox user 'agent' (uid 1000) so that the agent "
    "cannot write where rewards are written; remove it (the task must work for a non-root user)"
)
_NET_PHASES = (
    "the agent reaches only the model proxy whatever is set (invariant 6); the verifier inherits it unless "
    "[verifier] network_mode is set, as in Harbor. Never applies to the image build, as in Harbor"
)

FIELDS: dict[str, Rule] = {
    # -- top level --------------------------------------------------------------------------
    "schema_version": Rule(
        Status.SUPPORTED, "1.0-1.4 (Harbor's current is 1.4); other versions are refused, Harbor reads any string"
    ),
    "version": Rule(Status.SUPPORTED, "the legacy name of schema_version, as in Harbor"),
    "source": Rule(Status.SUPPORTED, "informational, as in Harbor"),
    "metadata": Rule(
        Status.SUPPORTED, "free-form table; harnessrl reads difficulty, category, split and repo (pools, disjointness)"
    ),
    "steps": Rule(
        Status.MAPPED,
        "[[steps]] run in order in one sandbox, as Harbor's: each step's agent phase gets steps/NAME/instruction.md "
        "(the harness starts again; the workspace, its HOME and the proxy trial carry over: one trajectory), then "
        "its verify phase runs test.sh from tests/ overlaid with steps/NAME/tests/, with every defence of a "
        "single verify; the oracle runs steps/NAME/solution/solve.sh, else solution/; /tests, /logs/verifier and "
        "/logs/agent are emptied before the next step (each step's logs are kept under steps/NAME/). A step's "
        "healthcheck runs before its agent (as [environment] healthcheck), its artifacts are collected after "
        "its agent with the task's, into steps/NAME/artifacts/. Timeouts: steps.agent timeout_sec, else "
        "[agent]'s; steps.verifier timeout_sec, 600 s when unset as in Harbor (never [verifier]'s); verifier "
        "env: [verifier] env, then the step's; steps.verifier user and network_mode, else [verifier]'s. The "
        "steps after one whose verifier gave no result or whose min_reward (a number: 'reward'; a table: each "
        "key; missing: -inf) is not met are skipped, as in Harbor. Differs: a step's failed verifier or "
        "healthcheck is the trial's verifier_error or env_setup_failed (Harbor averages the steps before it); "
        "docker's next step runs in a new agent container made from the last verifier's filesystem; kubernetes's "
        "in the same pod, whose verifier container's own filesystem (outside the workspace) the agent never "
        "sees, the agent's NetworkPolicy restored before it; a run's "
        "max_turns bounds the trial's model calls over all its steps. Before each step's agent, as Harbor: "
        "steps/NAME/workdir/ is merged into the working directory, its setup.sh run there (bash, the "
        "environment's env), then the step's healthcheck; differs: setup.sh runs as the sandbox user (uid "
        "1000) with no network, under the step's agent timeout, a failed one is env_setup_failed naming the "
        "step, a link in workdir/ is refused (step_setup). Refused: per-step "
        "agent.user, verifier allowlist, environment, collect",
        task_steps.refusal,  # the step fields that cannot run, by name
    ),
    "multi_step_reward_strategy": Rule(
        Status.SUPPORTED,
        "with [[steps]], as Harbor: 'mean' (unset too), per key over the steps that gave a result, a missing "
        "key counting 0; 'final', the last step's; other values are refused. Each step's rewards are kept in "
        "the outcome's steps, the captured trajectory (task_steps), the export and the dashboard's trajectory "
        "page; on a single-step task it has no effect, as in Harbor",
    ),
    "artifacts": Rule(
        Status.MAPPED,
        "collected as Harbor collects them: after the agent phase, before the verifier, into the trial's output "
        "folder (TrialOutcome.artifacts_dir) under artifacts/<destination or source>, with Harbor's "
        "artifacts/manifest.json (status ok, failed or skipped per entry; a missing source is 'failed', never a "
        "failed trial) and one event per entry (artifact:STATUS:SOURCE); exclude patterns as tar --exclude. "
        "Differences: links are resolved inside the sandbox and a link out of a collected directory is dropped "
        "(docker: the directory fails whole), a trial keeps at most 256 MiB and 20000 files, a relative source "
        "is from / (as docker cp), service other than 'main' is refused, and the local backend reaches only the "
        "workspace, HOME, /logs/agent and /logs/artifacts (other paths: 'failed'). Harbor's publish folder "
        "/logs/artifacts is in every sandbox, writable by the agent, a step's setup.sh and the verifier, and "
        "collected after the verifier (its manifest entry first, 'empty' when it held nothing) into "
        "artifacts/logs/artifacts/, per step for [[steps]]; a link the agent left there is removed before the "
        "verifier (a tamper event); on kubernetes the verifier does not see it (its writes there are not kept)",
    ),
    # -- [task] -------------------------------------------------------------------------------
    "task.name": Rule(Status.SUPPORTED, "org/name; the task's id"),
    "task.version": Rule(Status.SUPPORTED, "informational"),
    "task.description": Rule(Status.SUPPORTED, "informational"),
    "task.authors": Rule(Status.SUPPORTED, "informational (name, email)"),
    "task.keywords": Rule(Status.SUPPORTED, "informational"),
    # -- [verifier] ---------------------------------------------------------------------------
    "verifier.timeout_sec": Rule(
        Status.SUPPORTED, "a trial's verifier_timeout overrides it; default 600 s as in Harbor"
    ),
    "verifier.env": Rule(
        Status.SUPPORTED, "added to tests/test.sh's environment; '${VAR}' host templates are refused", _host_templates
    ),
    "verifier.user": Rule(
        Status.SUPPORTED,
        "tests/test.sh runs as it (a name or uid; unset: the image's USER, root for most images), as Harbor; "
        "local has root and uid 1000 only (root is uid 0 of a user namespace: the host system stays read-only), "
        "kubernetes numeric uids only",
    ),
    "verifier.network_mode": Rule(
        Status.SUPPORTED,
        "the verify phase's network, as Harbor: unset inherits [environment] network_mode (default 'public'); "
        "docker verifies in a fresh container from the agent's final filesystem on docker.verify_network "
        "(default 'auto': the engine's bridge network; an engine without one refuses, at start and naming the "
        "setting, the trials of a task whose verifier is public, which could otherwise score 0 for want of a "
        "network; 'none' verifies without one), local on local.verify_network (default 'auto': a bubblewrap "
        "sandbox has no network to give, so such trials are refused at start as on docker without a bridge; "
        "'none' verifies without one, 'host' on the worker's); "
        "never the host's network unless set so (the verifier runs the agent's code); "
        "'allowlist' (here or inherited) is refused at setup: no backend has an egress proxy",
    ),
    "verifier.allowed_hosts": Rule(Status.MAPPED, "only with 'allowlist', which is refused at setup"),
    "verifier.environment_mode": Rule(Status.SUPPORTED, "'shared' only; 'separate' is refused", _separate),
    "verifier.environment": Rule(
        Status.REFUSED, "a separate verifier environment is not supported yet: the verifier runs in the agent's sandbox"
    ),
    "verifier.collect": Rule(
        Status.REFUSED,
        "[[verifier.collect]] hooks (commands run in compose services to snapshot their state into artifacts for "
        "a separate verifier) are not supported: the verifier runs in the trial's sandbox, where the compose "
        "services stay reachable by name; query them from tests/test.sh",
    ),
    # -- [agent] ------------------------------------------------------------------------------
    "agent.timeout_sec": Rule(Status.SUPPORTED, "a trial's agent_timeout overrides it; unset: default_agent_timeout_s"),
    "agent.user": Rule(Status.REFUSED, _USER),
    "agent.network_mode": Rule(Status.MAPPED, "the agent reaches only the model proxy, whatever is set (invariant 6)"),
    "agent.allowed_hosts": Rule(Status.MAPPED, "the agent reaches only the model proxy, whatever is set"),
    # -- [environment] ------------------------------------------------------------------------
    "environment.build_timeout_sec": Rule(Status.SUPPORTED, "limit of the image build (docker build or local replay)"),
    "environment.docker_image": Rule(
        Status.SUPPORTED, "a prebuilt image (docker, kubernetes); the local backend replays a Dockerfile only"
    ),
    "environment.os": Rule(Status.SUPPORTED, "'linux' only; 'windows' is refused", _not_linux),
    "environment.cpus": Rule(Status.SUPPORTED, "CPU quota of the sandbox"),
    "environment.memory_mb": Rule(Status.SUPPORTED, "memory limit, capped at the sandbox's max_memory_mb"),
    "environment.storage_mb": Rule(Status.SUPPORTED, "disk limit, capped at the sandbox's max_storage_mb"),
    "environment.memory": Rule(Status.SUPPORTED, "legacy size ('2G', '512M'): becomes memory_mb, as in Harbor"),
    "environment.storage": Rule(Status.SUPPORTED, "legacy size ('10G'): becomes storage_mb, as in Harbor"),
    "environment.gpus": Rule(Status.SUPPORTED, "0 or unset only; a task asking for GPUs is refused", _gpus),
    "environment.gpu_types": Rule(Status.REFUSED, "GPU tasks are not supported by the sandbox service"),
    "environment.tpu": Rule(Status.REFUSED, "TPU tasks are not supported by the sandbox service"),
    "environment.env": Rule(
        Status.SUPPORTED,
        "environment of every phase (after the image's ENV); '${VAR}' host templates are refused",
        _host_templates,
    ),
    "environment.workdir": Rule(Status.SUPPORTED, "absolute path; overrides the image's WORKDIR"),
    "environment.skills_dir": Rule(
        Status.MAPPED,
        "a directory in the environment (relative: to the working directory), as in Harbor; its contents are "
        "copied in the sandbox before the agent starts to where each harness reads skills: claude-code "
        "~/.claude/skills, codex ~/.agents/skills, opencode ~/.config/opencode/skills, openhands-sdk "
        "~/.agents/skills (loaded by the SDK); mini-swe-agent is refused at trial start, as in Harbor; oracle, "
        "nop and shell (no model) ignore it, as Harbor's oracle and nop. A directory the sandbox lacks fails "
        "setup (env_setup_failed) naming the field; Harbor copies nothing",
    ),
    "environment.mcp_servers": Rule(
        Status.MAPPED,
        "given to each harness in its own config (claude-code --mcp-config, codex [mcp_servers.NAME], opencode "
        "mcp, openhands-sdk mcp_config; mini-swe-agent gets them listed in its instruction, as in Harbor; oracle, "
        "nop and shell ignore them, as Harbor's oracle and nop); Codex offers the tools as Responses 'namespace' "
        "tools, which the proxy offers to the model as mcp__NAME__TOOL. stdio servers run in the sandbox; a url's "
        "host must be localhost or a service of the task's compose "
        "file (the agent reaches nothing else); '${VAR}' headers are refused (no host environment reaches a "
        "sandbox); headers on mini-swe-agent and openhands-sdk, and sse on codex (its MCP client speaks stdio and "
        "streamable HTTP only), are refused at trial start",
    ),
    "environment.healthcheck": Rule(
        Status.MAPPED,
        "run after the sandbox starts and before the agent, as Harbor: bash -c command in the working "
        "directory, start_period_sec / start_interval_sec / interval_sec / retries with Harbor's defaults; the "
        "first pass goes on; retries consecutive failures after the start period end the trial env_setup_failed "
        "(the agent never runs) naming the command and its last output. Differences: it runs as the sandbox "
        "user (uid 1000, as the agent; Harbor: the image's USER) with the sandbox's own loopback only, an "
        "attempt past timeout_sec counts as a failure (Docker's meaning; Harbor's docker environment ends the "
        "trial); the local backend keeps no process between execs (an ENTRYPOINT does not run there), docker "
        "runs the image's ENTRYPOINT as Harbor's does",
    ),
    "environment.network_mode": Rule(Status.MAPPED, "'no-network' as Harbor; 'public' and 'allowlist': " + _NET_PHASES),
    "environment.allowed_hosts": Rule(Status.MAPPED, "none of them is reachable: " + _NET_PHASES),
    "environment.allow_internet": Rule(
        Status.MAPPED, "deprecated: false is network_mode 'no-network', true is 'public' (see there), as in Harbor"
    ),
    # -- [solution] ---------------------------------------------------------------------------
    "solution.env": Rule(
        Status.SUPPORTED,
        "environment of solution/solve.sh (the oracle); '${VAR}' host templates are refused",
        _host_templates,
    ),
}

# Files of a task directory, by path relative to it.
FILES: dict[str, Rule] = {
    "instruction.md": Rule(Status.SUPPORTED, "the agent's instruction; required, UTF-8, not empty"),
    "environment/Dockerfile": Rule(
        Status.SUPPORTED,
        "built with the build network (docker: build_network, default host; local: the host's) whatever the "
        "task's network_mode, as Harbor builds; heredocs as BuildKit reads them (see Dockerfile heredocs). "
        "Differs on local: FROM is recorded, not pulled (the host's read-only system is the base), so a RUN that "
        "installs packages (apt-get, as most real tasks' first RUN) fails setup naming its line and saying so: "
        "such tasks run on docker",
    ),
    "environment/docker-compose.yaml": Rule(
        Status.MAPPED,
        "sidecar services start with the sandbox and are reachable from it by service name, as Harbor: docker "
        "runs each in the main container's network namespace (names mapped to 127.0.0.1; no bridge, so two "
        "services cannot listen on one port), the agent reaches them and the model proxy, nothing else; the "
        "verifier reaches them too, and a public one also gets its network (docker.verify_network), the "
        "services' TCP ports relayed into it by the worker (UDP is not); kubernetes runs them as containers of the "
        "trial's pod (prebuilt images only); the local backend refuses the task. main's build (context, "
        "dockerfile, args; [environment] docker_image wins, as Harbor's prebuilt image), depends_on and "
        "environment (and main's image, command and deploy as Harbor writes them: see Harbor's compose "
        "variables), and each service's image, build (context inside the task), command, entrypoint, "
        "environment, working_dir, user, healthcheck, depends_on, init and expose are honoured; any other "
        "key (ports, networks, volumes, privileged, cap_add, ...) is refused naming it. ${VAR} is interpolated "
        "from Harbor's compose variables (below), environment/.env and [environment] env, never the worker's "
        "environment (a variable found in none, without a default, is refused by name)",
    ),
    "tests/test.sh": Rule(
        Status.MAPPED,
        "run with /bin/bash as [verifier] user or the image's USER (root for most images), as Harbor, after the "
        "agent phase (which runs as uid 1000); writes /logs/verifier/reward.txt or reward.json",
    ),
    "solution/solve.sh": Rule(Status.SUPPORTED, "the oracle harness runs it"),
}


def refusal(path: str, value: Any) -> str | None:
    """Why ``path`` (a FIELDS key) set to ``value`` is refused, or None."""
    rule = FIELDS[path]
    if rule.status == Status.REFUSED:
        return rule.note if is_set(value) else None
    return rule.refuse(value) if rule.refuse is not None else None


def file_refusals(root: Path) -> dict[str, str]:
    """The refused files ``root`` holds: path -> why."""
    return {name: rule.note for name, rule in FILES.items() if rule.status == Status.REFUSED and (root / name).exists()}


def render() -> str:
    """docs/harbor.md."""
    lines = [
        "# Harbor tasks in harnessrl",
        "",
        "<!-- generated from services/sandbox/task/harbor_fields.py: "
        "python -m services.sandbox.task.harbor_fields --write docs/harbor.md -->",
        "",
        "harnessrl reads Harbor-format tasks natively (`services/sandbox/task/model.py`). Every field of Harbor's",
        "task schema (versions 1.0-1.4) is **supported** (Harbor's meaning), **mapped** (runs, with a",
        "meaning that differs on purpose, written here) or **refused** (loading the task fails naming the",
        "file, the field and why). A key Harbor's schema lacks is ignored by Harbor; harnessrl ignores it",
        "too but warns, naming it. Check a task or a dataset before running it:",
        "",
        "    harnessrl tasks check-harbor DIR [--json]",
        "",
        "## task.toml",
        "",
        "| field | status | note |",
        "| --- | --- | --- |",
    ]
    for path, rule in FIELDS.items():
        section, _, key = path.rpartition(".")
        name = f"[{section}] {key}" if section else path
        lines.append(f"| `{name}` | {rule.status} | {rule.note} |")
    lines += ["", "## Files", "", "| file | status | note |", "| --- | --- | --- |"]
    lines += [f"| `{name}` | {rule.status} | {rule.note} |" for name, rule in FILES.items()]
    lines += [
        "",
        "## Differences that are not a field",
        "",
        "- **User.** Harbor runs the agent and the verifier as the image's USER (root unless the Dockerfile",
        "  says otherwise); harnessrl runs the agent as the sandbox user `agent` (uid 1000), so nothing it",
        "  runs can write where rewards are written, and the verifier as Harbor does.",
        "- **Network.** Harbor's default for both phases is `public`; harnessrl's agent reaches only the",
        "  model proxy; its verifier gets what Harbor gives it (`public` unless the task says otherwise).",
        "  `network_mode` and `allow_internet` never switch off the image build's network, in Harbor or here.",
        "",
    ]
    lines += harbor_notes.sections()
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    if not argv:
        sys.stdout.write(render())
        return 0
    if len(argv) == 2 and argv[0] in ("--write", "--check"):
        target = Path(argv[1])
        if argv[0] == "--write":
            target.write_text(render())
            return 0
        if target.is_file() and target.read_text() == render():
            return 0
        sys.stderr.write(f"{target} is out of date: python -m services.sandbox.task.harbor_fields --write {target}\n")
        return 1
    sys.stderr.write("usage: python -m services.sandbox.task.harbor_fields [--write FILE | --check FILE]\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
