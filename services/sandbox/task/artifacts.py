"""Harbor's task-level ``artifacts``: files and directories of the sandbox collected into
the trial's output folder after the agent phase, before the verifier.

Facts from Harbor 0.26 (``models/task/config.py`` ``ArtifactConfig``,
``models/task/artifacts.py``, ``trial/artifact_handler.py``, ``trial/single_step.py``):

- an entry is a path string or a table ``{source, destination, exclude, service}``;
  ``source`` has no ``..``; ``destination`` is relative, no ``..``, no backslash, never
  ``manifest.json``; ``exclude`` are tar ``--exclude`` patterns of a directory;
- collection runs after the agent phase and before the verifier (the verifier cannot
  change what was collected), best effort: a missing or unreadable source is a
  ``failed`` entry of the manifest, never a failed trial;
- it lands at ``<trial>/artifacts/<destination>``, or at the source without its leading
  ``/`` (``/app/out.txt`` -> ``artifacts/app/out.txt``); a later entry whose place
  overlaps an earlier one's is ``skipped``; ``artifacts/manifest.json`` lists every
  entry: source, destination, type (file, directory), status (ok, failed, skipped),
  exclude; harnessrl adds ``detail`` (why an entry failed or was cut).

Here the trial's output folder is ``TrialOutcome.artifacts_dir`` (next to ``agent/``,
``verifier/`` and ``result.json``): collected artifacts are under its ``artifacts/``,
and the outcome's events say each entry's status (``artifact:ok:/app/out.txt``).

Safety (the agent wrote what is collected): links are resolved inside the sandbox
(``realpath``), so a link never reaches the worker's files; inside a collected
directory, a link that leads out of it and anything that is not a file, directory or
link is dropped; a trial keeps at most ``MAX_BYTES`` and ``MAX_FILES``. On docker a
directory holding a link out fails whole (the engine's tar is unpacked with the
``data`` filter). Differences from Harbor: a ``service`` other than ``main`` (compose
sidecars) is refused at load; a relative source is from ``/``, as ``docker cp`` reads it.

Harbor's publish folder ``/logs/artifacts`` (its convention entry, first in every
collection): every sandbox has it, writable by the agent, a step's setup and the verifier,
behind it a folder of the trial on the worker (Harbor bind-mounts the trial's folder).
``collect_published`` copies it after the verifier (the mount is live while the verifier
runs, so its writes count too, as in Harbor) to ``artifacts/logs/artifacts/``, under the
same safety rules, its manifest entry first; a multi-step task's is collected and emptied
per step (Harbor moves its contents into the step's folder). An empty folder leaves no
trace but its manifest entry (``empty``, as Harbor) when the task collects something else;
a task that names ``/logs/artifacts`` itself gets its entry instead, collected with the
others before the verifier (Harbor: an explicit entry replaces the implicit one).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MANIFEST = "manifest.json"


class ArtifactEntry(BaseModel):
    """One entry of ``artifacts`` (Harbor's ``ArtifactConfig``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="A path in the sandbox (relative: from /).")
    destination: str | None = Field(default=None, description="Where under artifacts/ (relative).")
    exclude: list[str] = Field(default_factory=list, description="tar --exclude patterns of a directory.")
    service: str | None = Field(default=None, description="Compose service; only 'main' (the sandbox).")

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        if not v.strip() or not [p for p in PurePosixPath(v).parts if p != "/"]:
            raise ValueError(f"must name a file or directory in the sandbox, got {v!r}")
        if any(part == ".." for part in PurePosixPath(v).parts):
            raise ValueError(f"must not contain '..' components, got {v!r}")
        return v

    @field_validator("destination")
    @classmethod
    def _destination(cls, v: str | None) -> str | None:
        if not v:
            return None
        if "\\" in v:
            raise ValueError(f"must use '/' as separator, got {v!r}")
        path = PurePosixPath(v)
        if not path.parts:
            raise ValueError(f"must name a file or directory, got {v!r}")
        if path.is_absolute():
            raise ValueError(f"must be a relative path (under the trial's artifacts/), got {v!r}")
        if any(part == ".." for part in path.parts):
            raise ValueError(f"must not contain '..' components, got {v!r}")
        if v.rstrip("/") == MANIFEST:
            raise ValueError(f"{MANIFEST!r} is reserved for the collection manifest")
        return v

    @field_validator("service")
    @classmethod
    def _service(cls, v: str | None) -> str | None:
        if v not in (None, "main"):
            raise ValueError(
                f"collecting from compose service {v!r} is not supported: artifacts come from the trial's "
                "sandbox (service 'main') only"
            )
        return v

    @property
    def path(self) -> PurePosixPath:
        """The source in the sandbox, absolute."""
        return PurePosixPath("/") / self.source

    @property
    def relative(self) -> PurePosixPath:
        """Where it lands under artifacts/ (Harbor's ``artifact_host_path``)."""
        parts = [p for p in PurePosixPath(self.destination or self.source).parts if p not in ("", "/", "..")]
        return PurePosixPath(*parts) if parts else PurePosixPath(".")


def normalize_entries(value: Any) -> Any:
    """``artifacts`` as Harbor reads it: a string is ``{source = it}`` (a pydantic before-validator)."""
    if isinstance(value, list):
        return [{"source": v} if isinstance(v, str) else v for v in value]
    return value
