"""Assisted analysis (off unless configured): a run's anomaly summary goes to
an OpenAI-compatible endpoint the user named; the candidate explanations it
returns are stored with the run for a person to confirm or dismiss.

The key stays here: the browser only ever sees candidates, never the key or
the endpoint's raw answer. Nothing is acted on automatically.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from harnessrl.errors import FailedPrecondition, HarnessError, InvalidArgument, NotFound, Unavailable
from services.dashboard.settings import AnalysisSettings

VERDICTS = ("confirmed", "dismissed")
CATEGORIES = ("policy", "infrastructure", "unclear")
SYSTEM_PROMPT = (
    "You help engineers read reinforcement-learning runs of coding agents. Given a run's anomaly summary, "
    "propose candidate explanations: is it the policy regressing or the infrastructure breaking? Answer with "
    'JSON only: {"candidates": [{"title": str, "explanation": str, "category": "policy"|"infrastructure"|'
    '"unclear", "evidence": [str], "checks": [str]}]}. Evidence must cite numbers from the summary; checks are '
    "what a person should look at to confirm."
)


class AnalysisError(HarnessError):
    """The endpoint answered, but not with candidate explanations."""

    http_status = 502


def anomaly_summary(run_id: str, summary: dict[str, Any], tail: int = 8) -> dict[str, Any]:
    """What the model sees: the alerts and the recent steps of the series they come from."""

    def last(d: dict[Any, Any]) -> dict[str, Any]:
        return {str(k): v for k, v in list(d.items())[-tail:]}

    metrics = summary["metrics"][-tail:]
    return {
        "run_id": run_id,
        "alerts": summary["alerts"],
        "termination_by_step": last(summary["termination"]["by_step"]),
        "infra_share_by_step": last(summary["termination"]["infra_share"]),
        "zero_variance_share_by_step": last(summary["groups"]["zero_variance_share"]),
        "mean_turns_by_step": last(summary["behaviour"]["mean_turns"]),
        "malformed_tool_calls_by_step": last(summary["behaviour"]["malformed"]),
        "success_rate_by_step": last(summary["success_rate"]),
        "agreement_by_step": {
            str(m["step"]): {k: v for k, v in m["values"].items() if k.startswith("agreement/")} for m in metrics
        },
        "reward_by_step": {str(m["step"]): m["values"].get("reward/mean") for m in metrics},
    }


class Analyst:
    def __init__(self, settings: AnalysisSettings) -> None:
        self.settings = settings

    @property
    def enabled(self) -> bool:
        return self.settings.endpoint is not None

    async def candidates(self, anomalies: dict[str, Any]) -> list[dict[str, Any]]:
        if not self.enabled:
            raise FailedPrecondition("assisted analysis is off: set [dashboard.analysis] endpoint")
        s = self.settings
        headers = {"Authorization": f"Bearer {s.api_key.get_secret_value()}"} if s.api_key else {}
        body = {
            "model": s.model,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": json.dumps(anomalies, indent=1)},
            ],
        }
        url = f"{(s.endpoint or '').rstrip('/')}/chat/completions"
        try:
            async with httpx.AsyncClient(timeout=s.timeout_s) as client:
                resp = await client.post(url, json=body, headers=headers)
        except httpx.HTTPError as e:
            raise Unavailable(f"analysis endpoint unreachable: {type(e).__name__}: {e}") from e
        if resp.status_code != 200:
            raise AnalysisError(f"analysis endpoint answered {resp.status_code}: {resp.text[:300]}")
        try:
            content = resp.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise AnalysisError(f"analysis endpoint answered no chat completion: {resp.text[:300]}") from e
        return parse_candidates(str(content or ""), s.max_candidates)


def parse_candidates(content: str, limit: int) -> list[dict[str, Any]]:
    """The model's JSON (possibly fenced or with prose around it) -> clean candidates."""
    match = re.search(r"\{.*\}|\[.*\]", content, re.S)
    try:
        data = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        data = None
    items = data.get("candidates") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise AnalysisError(f"analysis endpoint answered no candidate list: {content[:300]!r}")
    out = []
    for item in items[:limit]:
        if not isinstance(item, dict) or not str(item.get("title", "")).strip():
            continue
        category = str(item.get("category", "unclear")).lower()
        out.append(
            {
                "title": str(item["title"])[:200],
                "explanation": str(item.get("explanation", ""))[:4000],
                "category": category if category in CATEGORIES else "unclear",
                "evidence": [str(e)[:500] for e in item.get("evidence", []) if isinstance(e, str | int | float)][:10],
                "checks": [str(c)[:500] for c in item.get("checks", []) if isinstance(c, str)][:10],
            }
        )
    if not out:
        raise AnalysisError(f"analysis endpoint answered no usable candidate: {content[:300]!r}")
    return out


class AnalysisStore:
    """Candidates and verdicts of one run: ``<run>/dashboard/analysis.json``, written atomically."""

    def __init__(self, run_dir: Path, store_dir: Path | None = None) -> None:
        base = store_dir / run_dir.name if store_dir is not None else run_dir / "dashboard"
        self.path = base / "analysis.json"

    def load(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except OSError as e:
            raise FailedPrecondition(
                f"cannot keep analysis candidates in {self.path}: {e} (set [dashboard.analysis] store_dir)"
            ) from e
        except json.JSONDecodeError as e:
            raise FailedPrecondition(f"{self.path} is not valid JSON: {e}") from e
        return list(data.get("candidates", []))

    def add(self, candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
        now = time.time()
        new = [{**c, "id": uuid.uuid4().hex[:12], "created_at": now, "verdict": None} for c in candidates]
        self._save(self.load() + new)
        return new

    def decide(self, candidate_id: str, verdict: str) -> dict[str, Any]:
        if verdict not in VERDICTS:
            raise InvalidArgument(f"verdict must be one of {list(VERDICTS)}, got {verdict!r}")
        items = self.load()
        for item in items:
            if item.get("id") == candidate_id:
                item["verdict"], item["decided_at"] = verdict, time.time()
                self._save(items)
                return item
        raise NotFound(f"no candidate {candidate_id!r}")

    def _save(self, items: list[dict[str, Any]]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".analysis-")
            with os.fdopen(fd, "w") as f:
                json.dump({"candidates": items}, f, indent=1)
            os.replace(tmp, self.path)
        except OSError as e:
            raise FailedPrecondition(
                f"cannot keep analysis candidates in {self.path}: {e} (set [dashboard.analysis] store_dir)"
            ) from e
