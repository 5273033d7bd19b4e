"""``harnessrl conformance``: the installed real harnesses, unmodified, against a
real proxy, capture store and gateway with the scripted engine as the policy.

Each harness runs a few scenarios; each scenario is one trial, checked against
the engine's own generation log (``check_faithful``: every sampled token in
exactly one segment, in the context the engine saw) and for its own point:

- ``tools``: a multi-turn, tool-using task is completed (the file exists);
- ``sub-agent``: a sub-agent the harness spawns is its own trainable thread,
  and the main thread stays one segment (nothing mixed);
- ``compaction``: the harness compacts its history; the main thread goes on
  in a new segment whose prompt is the rewritten context (it holds the summary
  the policy wrote), no turn lost, none trained twice;
- ``side calls``: title/summary calls are side threads, labelled ``side`` and
  not trainable under the default ``trainable_thread_kinds``.

Cells are passed, failed, or n/a with the reason (the harness has no such
feature, does not do it here, or is not installed). The chat template and the
protocol and streaming each harness uses are reported beside the cells."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.errors import ConfigError
from harnessrl.paths import default_model_dir
from stack.conformance.declared import DeclaredDriver, declared_drivers, declared_scenarios
from stack.conformance.drivers import DRIVERS, Driver, Target
from stack.conformance.proxy_stack import ProxyStack, check_faithful, write_script

MODEL = default_model_dir().name
TASK = "Create hello.txt containing hello"
SUMMARY = "Summary of the work so far: the user asked for hello.txt containing hello; the listing is done."
COLUMNS = ("tools", "sub-agent", "compaction", "side calls")
PASSED, FAILED, NA = "passed", "failed", "n/a"


@dataclass(frozen=True)
class Cell:
    harness: str
    scenario: str
    status: str  # passed | failed | n/a
    detail: str = ""
    seconds: float = 0.0
    chat_template: str = ""  # what the proxy rendered with, from the trial summary


@dataclass
class Outcome:
    """One scenario's trial, as the checks see it."""

    proc: Any  # subprocess.CompletedProcess[str]
    work: Path
    home: Path
    summary: dict[str, Any]
    segments: list[dict[str, Any]]
    engine_log: list[dict[str, Any]]

    def threads(self) -> dict[str, dict[str, Any]]:
        return {t["name"]: t for t in self.summary["threads"]}

    def of(self, thread: str) -> list[dict[str, Any]]:
        return sorted((s for s in self.segments if s["thread"] == thread), key=lambda s: s["segment_index"])


class CheckFailed(AssertionError):
    pass


def expect(ok: bool, message: str) -> None:
    if not ok:
        raise CheckFailed(message)


@dataclass(frozen=True)
class Scenario:
    threads: dict[str, list[dict[str, Any]]]  # the scripted policy, per thread name
    check: Callable[[Outcome], None]
    options: dict[str, Any] = field(default_factory=dict)  # driver knobs
    script_extra: dict[str, Any] = field(default_factory=dict)
    min_main_turns: int = 2
    proxy: dict[str, Any] = field(default_factory=dict)  # proxy settings beyond the stack's own


def bash(name: str, command: str, **extra: Any) -> dict[str, Any]:
    key = "cmd" if name == "exec_command" else "command"
    return {"content": "Working on it.", "tool_calls": [{"name": name, "arguments": {key: command, **extra}}]}


def done_file(o: Outcome) -> None:
    expect(o.proc.returncode == 0, f"harness exit {o.proc.returncode}: {o.proc.stderr[-800:]}")
    hello = o.work / "hello.txt"
    expect(hello.exists() and hello.read_text() == "hello\n", "hello.txt was not written")


def check_sub_agent(o: Outcome) -> None:
    done_file(o)
    threads = o.threads()
    sub = threads.get("subagent-1")
    expect(sub is not None and sub["kind"] == "subagent" and sub["trainable"], f"no trainable sub-agent: {threads}")
    expect(sub is not None and sub["num_turns"] == 2, f"sub-agent turns: {sub}")
    expect(len(o.of("main")) == 1, f"main fragmented into {len(o.of('main'))} segments")
    expect(all(s["trainable"] for s in o.of("main")), "main is not trainable")
    agents = {n for n, t in threads.items() if t["kind"] != "side"}
    expect(agents == {"main", "subagent-1"}, f"agent threads {sorted(agents)}, expected main and subagent-1")


def check_compaction(o: Outcome) -> None:
    done_file(o)
    main = o.of("main")
    expect(len(main) >= 2, f"no rewrite of main: {len(main)} segment(s), threads {o.threads()}")
    from services.proxy.chat.tokenizer import Tokenizer  # only here: loading it costs a second

    # the last segment is the compacted context (Claude Code's summary request may open one of its own)
    text = Tokenizer(default_model_dir()).decode(main[-1]["prompt_ids"], skip_special_tokens=False)
    expect(SUMMARY in text, "the new main segment's prompt lacks the summary the policy wrote")
    expect("\n1999\n2000\n" not in text, "the new main segment's prompt still holds the compacted tool output")
    side = [s for s in o.segments if s["thread_kind"] == "side"]
    expect(all(not s["trainable"] for s in side), "a summary side call is trainable")


def check_side_calls(o: Outcome) -> None:
    side = [s for s in o.segments if s["thread_kind"] == "side"]
    expect(bool(side), f"no side thread: {o.threads()}")
    expect(all(not s["trainable"] for s in side), "a side call is trainable by default")
    expect(all(s["thread"].startswith("side-") for s in side), "side threads are labelled side-N")


def check_tools_and_side_calls(o: Outcome) -> None:
    done_file(o)
    check_side_calls(o)


def check_compaction_and_side_calls(o: Outcome) -> None:
    check_compaction(o)
    check_side_calls(o)


CLAUDE_TOOLS: list[dict[str, Any]] = [
    {
        "content": "I'll look first.",
        "tool_calls": [{"name": "Bash", "arguments": {"command": "ls -la", "description": "List files"}}],
    },
    {
        "reasoning": "Now write it.",
        "content": "Creating the file.",
        "tool_calls": [
            {"name": "Bash", "arguments": {"command": "echo hello > hello.txt", "description": "Create hello.txt"}}
        ],
    },
    {"content": "Created hello.txt containing hello."},
]
CLAUDE_AGENT = {
    "name": "Agent",
    "arguments": {"description": "Create file", "prompt": TASK, "subagent_type": "general-purpose"},
}
DELEGATING: list[dict[str, Any]] = [{"content": "Delegating.", "tool_calls": [CLAUDE_AGENT]}, {"content": "Done."}]
# Claude Code compacts past the auto-compact threshold: 16% of a 100k window (its
# minimum). Its system prompt and tools are ~12.4k tokens; 2,000 lines of `seq`
# put the context past 16k before the third call, and the compacted context
# (~12.8k) stays under it. The summary request extends main (same system prompt,
# tools and history), so the policy's summary is main's third turn.
CLAUDE_COMPACT_ENV = {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000", "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": "16"}


def claude_scenarios() -> dict[str, Scenario | str]:
    sub = [bash("Bash", "echo hello > hello.txt", description="Write"), {"content": "Created hello.txt."}]
    compact = [
        bash("Bash", "seq 1 2000", description="Count"),
        bash("Bash", "echo hello > hello.txt", description="Write"),
        {"content": f"<analysis>Short.</analysis>\n<summary>\n{SUMMARY}\n</summary>"},
        {"content": "Created hello.txt containing hello."},
    ]
    return {
        "tools": Scenario({"main": CLAUDE_TOOLS}, done_file, script_extra={"chunk_tokens": 4}, min_main_turns=3),
        "sub-agent": Scenario(
            {
                "main": DELEGATING,
                "subagent-1": sub,
            },
            check_sub_agent,
            options={"allowed_tools": ("Bash", "Agent")},
        ),
        "compaction": Scenario({"main": compact}, check_compaction, options={"env": CLAUDE_COMPACT_ENV}),
        "side calls": "in -p mode Claude Code makes no title or summary call (only main's requests reach the proxy, "
        "with or without CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC); its compaction request is main's own "
        "(main's system prompt, tools and history), trained as main",
    }


def opencode_scenarios() -> dict[str, Scenario | str]:
    def oc(command: str) -> dict[str, Any]:
        return bash("bash", command, description="Run")

    tools = [oc("ls -la"), oc("echo hello > hello.txt"), {"content": "Created hello.txt."}]
    # limit.context 14000: the seq output (~9k tokens) pushes the next turn past it
    compact = [oc("seq 1 2000"), oc("echo hello > hello.txt"), {"content": "Created hello.txt."}]
    tools_threads = {"main": tools, "*": [{"content": "Create hello"}]}
    # OpenCode's general sub-agent runs under the main system prompt: the case threads by structure are for
    sub_task = {"description": "Create file", "prompt": "Write hello.txt, then report", "subagent_type": "general"}
    task = {"content": "Delegating.", "tool_calls": [{"name": "task", "arguments": sub_task}]}
    sub = [oc("echo hello > hello.txt"), {"content": "Created hello.txt."}]
    return {
        "tools": Scenario(tools_threads, done_file, script_extra={"chunk_tokens": 3}, min_main_turns=3),
        "sub-agent": Scenario(
            {"main": [task, {"content": "Done."}], "subagent-1": sub, "*": [{"content": "Create hello"}]},
            check_sub_agent,
        ),
        "compaction": Scenario(
            {"main": compact, "*": [{"content": SUMMARY}]}, check_compaction, options={"context_limit": 14000}
        ),
        # the tools run again, checked for its title call
        "side calls": Scenario(tools_threads, check_tools_and_side_calls, script_extra={"chunk_tokens": 3}),
    }


def codex_scenarios() -> dict[str, Scenario | str]:
    tools = [
        bash("exec_command", "ls -la"),
        {**bash("exec_command", "echo hello > hello.txt"), "reasoning": "Write it now."},
        {"content": "Created hello.txt."},
    ]
    compact = [bash("exec_command", "seq 1 2000"), bash("exec_command", "echo hello > hello.txt")]
    compact.append({"content": "Created hello.txt."})
    compact_threads = {"main": compact, "*": [{"content": SUMMARY}]}
    # Above the first prompt (~10k tokens with Codex 0.171's 12 tools: its multi_agent_v1 namespace alone
    # is ~2.7k since the proxy offers namespace tools) and below it plus the seq output (~9k tokens).
    compact_options = {"auto_compact_token_limit": 12000}
    return {
        "tools": Scenario({"main": tools, "*": [{"content": "Title"}]}, done_file, script_extra={"chunk_tokens": 3}),
        "sub-agent": "the capture files Codex's sub-agent as subagent-1 by its x-codex-turn-metadata thread_id "
        "(tests/e2e/test_codex_subagent_tools.py), but a scripted spawn here left hello.txt unwritten (main "
        "probably ends before the sub-agent's command runs; a wait_agent turn is not scripted yet)",
        "compaction": Scenario(compact_threads, check_compaction, options=compact_options),
        # the compaction run again, checked for its summary call (Codex makes no title call)
        "side calls": Scenario(compact_threads, check_compaction_and_side_calls, options=compact_options),
    }


def mini_scenarios() -> dict[str, Scenario | str]:
    main = [
        bash("bash", "ls -la"),
        bash("bash", "echo hello > hello.txt"),
        bash("bash", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
    ]
    return {
        "tools": Scenario({"main": main}, done_file, min_main_turns=3),
        "sub-agent": "mini-swe-agent has one bash tool and no sub-agents",
        "compaction": "mini-swe-agent never rewrites its history: its package has no compaction or summary step, "
        "and a ContextWindowExceededError aborts the run",
        "side calls": "mini-swe-agent makes only the agent's calls",
    }


def openhands_scenarios() -> dict[str, Scenario | str]:
    main = [
        bash("terminal", "ls -la"),
        bash("terminal", "echo hello > hello.txt"),
        {"content": "Done.", "tool_calls": [{"name": "finish", "arguments": {"message": "Created hello.txt"}}]},
    ]

    sub_task = {
        "description": "Create file",
        "prompt": "Write hello.txt, then report",
        "subagent_type": "general-purpose",
    }
    task = {"content": "Delegating.", "tool_calls": [{"name": "task", "arguments": sub_task}]}
    sub = [bash("terminal", "echo hello > hello.txt"), main[-1]]
    compact = [
        bash("terminal", "seq 1 2000"),
        bash("terminal", "echo hello > hello.txt"),
        bash("terminal", "cat hello.txt"),
        bash("terminal", "ls"),
        bash("terminal", "pwd"),
        main[-1],
    ]

    def finished(o: Outcome) -> None:
        done_file(o)
        expect("FINISHED" in o.proc.stdout, "the conversation did not finish")

    def compacted(o: Outcome) -> None:
        finished(o)
        check_compaction(o)

    def condensed_by_a_side_call(o: Outcome) -> None:
        compacted(o)
        check_side_calls(o)

    return {
        "tools": Scenario({"main": main}, finished, min_main_turns=3),
        "sub-agent": Scenario(
            {"main": [task, main[-1]], "subagent-1": sub}, check_sub_agent, options={"task_tool": True}
        ),
        # with the SDK's LLMSummarizingCondenser (max_size 6 events, the first kept): past 6 events it
        # summarises the middle ones (the seq output among them) in a call of its own
        "compaction": Scenario(
            {"main": compact, "*": [{"content": SUMMARY}]}, compacted, options={"condenser_max_size": 6}
        ),
        # the compaction run again, checked for the condenser's summary call
        "side calls": Scenario(
            {"main": compact, "*": [{"content": SUMMARY}]}, condensed_by_a_side_call, options={"condenser_max_size": 6}
        ),
    }


SCENARIOS: dict[str, Callable[[], dict[str, Scenario | str]]] = {
    "claude-code": claude_scenarios,
    "opencode": opencode_scenarios,
    "codex": codex_scenarios,
    "mini-swe-agent": mini_scenarios,
    "openhands-sdk": openhands_scenarios,
}


def scenarios_of(harness: str) -> dict[str, Scenario | str]:
    """A harness's cells: a built-in one's from SCENARIOS, a declared one's from its file."""
    if harness in SCENARIOS:
        return SCENARIOS[harness]()
    driver = all_drivers().get(harness)
    if not isinstance(driver, DeclaredDriver):
        raise ConfigError(f"unknown harness {harness!r}; known: {sorted(all_drivers())}")
    return declared_scenarios(driver.adapter.declaration)


def all_drivers() -> dict[str, Driver]:
    return {**DRIVERS, **declared_drivers()}


def tools_script(harness: str) -> list[dict[str, Any]]:
    """The scripted main thread of a harness's tools scenario (other suites drive the same task)."""
    scenario = scenarios_of(harness)["tools"]
    assert isinstance(scenario, Scenario)
    return scenario.threads["main"]


def resolve_harnesses(names: Sequence[str]) -> list[Driver]:
    """The drivers named (all when none is); an unknown name is a ConfigError listing the valid ones."""
    drivers = all_drivers()
    unknown = [n for n in names if n not in drivers]
    if unknown:
        raise ConfigError(f"unknown harness(es) {unknown}; known: {sorted(drivers)}")
    return [drivers[n] for n in (names or drivers)]


def run_scenario(driver: Driver, scenario: Scenario, folder: Path, timeout: float = 300) -> Outcome:
    """One trial of ``driver`` under ``scenario``; raises CheckFailed / Unfaithful on a failed check."""
    home, work = folder / "home", folder / "work"
    home.mkdir(parents=True)
    work.mkdir()
    script = write_script(folder, scenario.threads, **scenario.script_extra)
    trial = f"{driver.name}-conformance"
    with ProxyStack(folder, script, **scenario.proxy) as stack:
        base, token = stack.new_trial(trial, MODEL)
        proc = driver.run(Target(base, token, MODEL, work, home), TASK, scenario.options, timeout)
        summary = stack.close_trial(trial)
        outcome = Outcome(proc, work, home, summary, stack.export(trial), stack.engine_log())
    expect(summary["render_mismatches"] == 0, f"{summary['render_mismatches']} render mismatches")
    expect(summary["malformed_tool_calls"] == 0, "malformed tool calls")
    expect(all(s["closed"] for s in outcome.segments), "a segment was left open")
    main_turns = sum(s["num_turns"] for s in outcome.of("main"))
    expect(main_turns >= scenario.min_main_turns, f"main has {main_turns} turns: {summary}")
    check_faithful(outcome.segments, outcome.engine_log, trial)
    scenario.check(outcome)
    return outcome


def run_cell(driver: Driver, column: str, folder: Path) -> Cell:
    if not driver.installed():
        return Cell(driver.name, column, NA, f"not installed ({driver.path})")
    if isinstance(driver, DeclaredDriver):  # it may not be registered yet (`harnessrl harness add`)
        scenario = declared_scenarios(driver.adapter.declaration)[column]
    else:
        scenario = scenarios_of(driver.name)[column]
    if isinstance(scenario, str):
        return Cell(driver.name, column, NA, scenario)
    start = time.monotonic()
    try:
        outcome = run_scenario(driver, scenario, folder)
    except AssertionError as e:  # CheckFailed, Unfaithful
        return Cell(driver.name, column, FAILED, str(e)[:500], time.monotonic() - start)
    except (subprocess.TimeoutExpired, OSError, RuntimeError, ValueError) as e:  # the cell failed, the run goes on
        return Cell(driver.name, column, FAILED, f"{type(e).__name__}: {e}"[:500], time.monotonic() - start)
    template = str(outcome.summary.get("chat_template", ""))
    return Cell(driver.name, column, PASSED, "", time.monotonic() - start, template)


@dataclass
class Report:
    rows: list[dict[str, Any]]  # per harness: name, version, protocol, streaming, template, cells

    def to_json(self) -> str:
        return json.dumps({"model": MODEL, "harnesses": self.rows}, indent=2)


def run_matrix(
    harnesses: Sequence[str] = (), columns: Sequence[str] = COLUMNS, on_cell: Callable[[Cell], None] | None = None
) -> Report:
    bad = [c for c in columns if c not in COLUMNS]
    if bad:
        raise ConfigError(f"unknown scenario(s) {bad}; known: {list(COLUMNS)}")
    rows = []
    for driver in resolve_harnesses(harnesses):
        cells = {}
        with tempfile.TemporaryDirectory(prefix=f"conformance-{driver.name}-") as tmp:
            for column in columns:
                cell = run_cell(driver, column, Path(tmp) / column.replace(" ", "-"))
                cells[column] = asdict(cell)
                if on_cell is not None:
                    on_cell(cell)
        rows.append(
            {
                "harness": driver.name,
                "version": driver.version() if driver.installed() else "not installed",
                "protocol": driver.protocol,
                "streaming": driver.streaming,
                "chat_template": ", ".join(sorted({c["chat_template"] for c in cells.values() if c["chat_template"]})),
                "cells": cells,
            }
        )
    return Report(rows)


def _mark(cell: dict[str, Any]) -> str:
    return {PASSED: "passed", FAILED: "FAILED", NA: "n/a"}[cell["status"]]


def render_markdown(report: Report) -> str:
    """The conformance matrix (docs/proxy.md): one row per harness, a footnote per n/a or failed cell."""
    head = ["harness", "version", "protocol", "streaming", *COLUMNS, "chat template"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    notes: list[str] = []
    for row in report.rows:
        marks = []
        for column in COLUMNS:
            cell = row["cells"].get(column)
            if cell is None:
                marks.append("")
                continue
            mark = _mark(cell)
            if cell["detail"]:
                notes.append(f"{row['harness']}, {column}: {cell['detail']}")
                mark += f" [{len(notes)}]"
            marks.append(mark)
        stream = "yes" if row["streaming"] else "no"
        cols = [row["harness"], row["version"], row["protocol"], stream, *marks, row["chat_template"] or "-"]
        lines.append("| " + " | ".join(cols) + " |")
    lines += ["", f"Model: {MODEL}, played by the scripted engine."]
    lines += [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    return "\n".join(lines)


def render_text(report: Report) -> str:
    rows = [["harness", "version", "protocol", "stream", *COLUMNS, "template"]]
    for row in report.rows:
        marks = [_mark(row["cells"][c]) if c in row["cells"] else "" for c in COLUMNS]
        stream = "yes" if row["streaming"] else "no"
        rows.append([row["harness"], row["version"], row["protocol"], stream, *marks, row["chat_template"] or "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    for row in report.rows:
        for column, cell in row["cells"].items():
            if cell["detail"]:
                out.append(f"{row['harness']} / {column}: {_mark(cell)}: {cell['detail']}")
    return "\n".join(out)
