"""The parts of docs/harbor.md that are not a task.toml field or a file: Harbor's compose
variables (from ``compose_env``, so the table and the code cannot drift apart) and the
rules for rewards, Dockerfile syntax and the verifier's network. ``harbor_fields.render``
appends ``sections()``."""

from __future__ import annotations

from services.sandbox.task import compose_env

# Harbor 0.26's docker environment (ComposeInfraEnvVars, legacy_log_mount_env_vars) -> the value here.
_DEFINED = {
    "MAIN_IMAGE_NAME": f"`{compose_env.MAIN_IMAGE}`, a name that stands for the trial's own image: main's "
    "`image` may name it (as Harbor's Terminal-Bench mapper writes), and a sidecar whose `image` is it runs "
    "the trial's image (docker: the prepared build; kubernetes: the pod's image)",
    "CONTEXT_DIR": "the task's environment/ folder (absolute), the build context of main, as in Harbor",
    "TEST_DIR": "`/tests`, where the verify phase has tests/ (older Harbor set it so; 0.26 leaves it unset, "
    "which compose reads as '')",
    "ENV_VERIFIER_LOGS_PATH": "`/logs/verifier`, where the verifier writes its reward, in every backend",
    "ENV_AGENT_LOGS_PATH": "`/logs/agent`",
    "ENV_ARTIFACTS_PATH": "`/logs/artifacts`, the publish folder of artifacts",
}


_FORMS = {
    "PREBUILT_IMAGE_NAME": "the prebuilt image's name (main's or a sidecar's `image` may name it)",
    "CPUS": "the task's cpus (main's `deploy.resources.limits.cpus` may name it: the sandbox applies it anyway)",
    "MEMORY": "`<memory_mb>M` (main's `deploy.resources.limits.memory` may name it; nothing else of `deploy` "
    "is supported)",
}


def compose_variables() -> list[str]:
    lines = [
        "## Harbor's compose variables",
        "",
        "Harbor runs `environment/docker-compose.yaml` with variables of its own, which win over",
        "environment/.env and [environment] env as in Harbor. Each is defined with its meaning here,",
        "on docker and kubernetes alike, or refused by name where it has none:",
        "",
        "| variable | value here |",
        "| --- | --- |",
    ]
    lines += [f"| `{name}` | {value} |" for name, value in _DEFINED.items()]
    lines += [
        f"| `{name}` | {_FORMS[name]}, set only where the task sets {source}, as in Harbor |"
        for name, source in compose_env.UNSET_UNLESS.items()
    ]
    lines += [f"| `{name}` | refused: it {why} |" for name, why in compose_env.REFUSED.items()]
    lines += [
        "",
        "main's `command` may be Harbor's keep-alive (`sh -c 'sleep infinity'`, `sleep infinity`,",
        "`tail -f /dev/null`) and nothing else: main's process is the sandbox's own.",
        "",
    ]
    return lines


REWARDS = [
    "## Rewards",
    "",
    "The verifier writes /logs/verifier/reward.txt (one number: the key `reward`) or reward.json (a",
    "number, or an object of numbers). Every key is kept: in the trial's outcome (`rewards`), the",
    "sandbox's TrialStatus, the captured trajectory, the export and the dashboard. Which value trains is",
    "the run's choice, `[run] reward_key` or `reward_weights`; without one, Harbor's trial reward: the",
    "key `reward`, else the only key. With several keys and none named `reward` Harbor reports no single",
    "reward (each key's mean), and neither does harnessrl: the trial ends `completed` (the verifier did",
    "its job: never an infrastructure reason) with every key and **no scalar reward** (no default: any",
    "number would be a reward the task did not give). Then:",
    "",
    "- `harnessrl trial run` prints every key and says to set reward_key or reward_weights;",
    "- `harnessrl eval` counts such trials `unscored` (neither success nor failure, not in pass@k) and",
    "  prints each key's mean;",
    "- a training run is refused before it starts: preflight runs each task's oracle and names the",
    "  tasks that write several keys without `reward`, and their keys (a trainer would also count such",
    "  a trial `missing_reward` and never train on it);",
    "- `harnessrl tasks check-harbor` says when tests/ writes reward.json, and names the keys and what a",
    "  run must set once a preflight has run the task's oracle.",
    "",
    "A key named by reward_key or reward_weights that the verifier did not write, and a reward file that",
    "is missing or not finite numbers, are `verifier_error` (an infrastructure reason), never a 0.",
    "",
]


DOCKERFILES = [
    "## Dockerfile heredocs",
    "",
    "`RUN <<EOF`, `COPY <<EOF /path` (and `ADD`), several heredocs in one instruction, `<<-` (leading",
    "tabs stripped) and quoted delimiters (`<<\"EOF\"`, `<<'EOF'`: a COPY body is not expanded) run as",
    "BuildKit's Dockerfile frontend runs them (`services/sandbox/task/heredoc.py`): a RUN whose command",
    "is one heredoc runs its body with the stage's SHELL (a body starting `#!` runs as the file",
    "`/dev/pipes/NAME`, mode 0755); any other RUN passes the command and the bodies to the shell, which",
    "reads the heredocs itself; a COPY heredoc is a file NAME, mode 0644, with `$VAR`/`${VAR}` expanded",
    "from the build's ARG and ENV (and the base image's ENV) unless its delimiter is quoted.",
    "",
    "- **local**: the replay runs them so (`/dev/pipes` is a read-only mount of that RUN).",
    "- **docker**: the engine setup installs (Debian's docker.io 20.10) builds with the classic builder,",
    "  which cannot read heredocs, and a `# syntax=` line would pull a frontend image from a registry.",
    "  Debian 12 has no newer builder (buildah 1.28 and podman 4.3 predate heredocs; docker-buildx and",
    "  docker.io 26 are in Debian 13 only, whose packages would replace the engine on a Debian 12 host),",
    "  and no PyPI or npm package found ships one. So the docker backend rewrites such a Dockerfile for",
    "  the classic builder with the same meaning: a one-heredoc RUN becomes the exec form `SHELL + [body]`; a `#!`",
    "  body is written to `/dev/pipes/NAME` (the build container's tmpfs, never in the image) and run;",
    "  a COPY heredoc's file travels in the build context (`.harnessrl-heredocs/`, 0644, root) and is",
    "  copied by an exec-form COPY. Every other line is sent as written. Refused by name: a `#!`",
    "  heredoc RUN under a non-root USER (only root may write `/dev/pipes`) and RUN flags with heredocs",
    "  (`--mount`, `--network`: the classic builder reads no RUN flag). Compose sidecar builds get the",
    "  same rewrite.",
    "",
    "## Refused for now",
    "",
    '- **A separate verifier environment** (`[verifier] environment`, `environment_mode = "separate"`):',
    "  the verifier runs in the trial's own sandbox (from the agent's final filesystem); a second",
    "  environment built for the verifier, with its own image, network and collect hooks, is not",
    "  supported yet, so such a task is refused when it loads.",
    "- **`COPY --from=<image>`** of an image that is not a stage: the local backend refuses any",
    "  `COPY --from` (it has no image store); the docker backend builds it only where the engine has",
    "  the image (or may pull it): with no reachable registry the build fails naming the image.",
    "",
]


VERIFIER_NETWORK = [
    "## A public verifier's network",
    "",
    "Harbor's verifier is `public` unless the task says otherwise ([verifier] network_mode, else",
    "[environment]'s), and real tasks use it: their test.sh `apt-get install`s curl, fetches `uv`",
    "and runs `uvx ... pytest`. A verifier that cannot reach the network fails there and would score",
    "0: an infrastructure failure as a reward (invariant 5). So each backend's `verify_network`",
    "decides the same way, at trial start, before anything is built:",
    "",
    "| backend | default | a public verifier gets |",
    "| --- | --- | --- |",
    "| docker | `auto` | the engine's `bridge` network; an engine without one (`--bridge=none`) refuses the trial |",
    "| local | `auto` | nothing to give (a bubblewrap sandbox has no network of its own): the trial is refused |",
    "| kubernetes | (none) | the cluster's network: the verify phase's NetworkPolicy lets all egress through |",
    "",
    "A refused trial ends `env_setup_failed` (weight 0, counted) with the setting to change, and",
    "preflight fails on it before a run starts; `harnessrl tasks check-harbor` names such tasks (a",
    "`network` line; `public_verifier` in --json). The ways out, each a choice someone makes:",
    '`network_mode = "no-network"` in the task\'s [verifier] (or [environment]) when its tests need no',
    'network (the built-in pools say so); `verify_network = "none"` to verify such tasks with no',
    'network anyway (the tests do, for tasks whose verifiers need none); `"host"` for the worker',
    "host's network, which the agent's code that the verifier runs would reach too (loopback services",
    "included). A task that names no verifier network is not guessed at: whether a test.sh needs the",
    "network cannot be told from the task.",
    "",
]


def sections() -> list[str]:
    return compose_variables() + REWARDS + VERIFIER_NETWORK + DOCKERFILES
