"""The front's client of the executor's HTTP API (see ``services/sandbox/executor.py``
for the routes). Maps its answers onto the shared error hierarchy, so a refusal
reaches the gRPC caller with the executor's own message."""

from __future__ import annotations

from typing import Any

import httpx
from google.protobuf import json_format

from harnessrl import tls
from harnessrl.errors import AlreadyExists, FailedPrecondition, HarnessError, InvalidArgument, NotFound, Unavailable
from harnessrl.v1 import sandbox_pb2


class ExecutorUnreachable(Unavailable):
    """The executor did not answer (down, restarting, network): the lease clock runs."""


class ExecutorClient:
    def __init__(self, url: str, token: str | None, timeout_s: float, tls_settings: tls.TlsSettings) -> None:
        self.url = url
        headers = {"authorization": f"Bearer {token}"} if token else {}
        # https:// verifies the executor against the front's tls.ca_file (the system's CAs without one).
        verify = tls.client_context(tls_settings) or True
        self._http = httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s, verify=verify)

    async def validate(self, spec: sandbox_pb2.TrialSpec) -> None:
        await self._call("POST", "/v1/validate", {"spec": _json(spec)})

    async def start(
        self, spec: sandbox_pb2.TrialSpec, trace_context: dict[str, str], previous_id: str
    ) -> dict[str, Any]:
        body = {"spec": _json(spec), "trace_context": trace_context, "previous_id": previous_id}
        return await self._call("PUT", f"/v1/executions/{spec.trial_id}", body)

    async def get(self, execution_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/executions/{execution_id}")

    async def cancel(self, execution_id: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/executions/{execution_id}/cancel")

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            resp = await self._http.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise ExecutorUnreachable(f"executor {self.url}: {type(e).__name__}: {e}") from e
        if resp.status_code < 300:
            return resp.json() if resp.content else {}
        raise _error(resp, f"executor {self.url}{path}")


def _json(spec: sandbox_pb2.TrialSpec) -> dict[str, Any]:
    return json_format.MessageToDict(spec, preserving_proto_field_name=True)


def _error(resp: httpx.Response, where: str) -> HarnessError:
    try:
        detail: Any = resp.json().get("detail", resp.text)
    except ValueError:
        detail = resp.text
    if isinstance(detail, list):  # a request-validation error: [{loc, msg}, ...]
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    message = f"{detail}" if resp.status_code in (400, 409, 422) else f"{where}: HTTP {resp.status_code}: {detail}"
    if resp.status_code in (400, 422):
        return InvalidArgument(message)
    if resp.status_code == 404:
        return NotFound(message)
    if resp.status_code == 409:
        return AlreadyExists(message)
    if resp.status_code in (401, 403):
        return FailedPrecondition(f"{message} (check executor_token)")
    return ExecutorUnreachable(message)
