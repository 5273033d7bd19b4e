"""``harnessrl bench vllm-path`` at a tiny size against a real vLLM CPU server and the
services as deployed (separate processes): every path answers, one conversation at a
time and two at once, CPU is attributed to our processes, the report prints.

The server is the session's shared one (``vllm_server`` in tests/vllm_support.py),
given to the bench as its ``vllm_url`` (``--vllm-url``): this test is about the paths,
not about starting vLLM (``VllmServer``, which the bench starts without a URL, is
what the fixture starts). With a URL the bench does not read vLLM's own CPU (its
report's last column is ``-``); no assertion here reads it."""

from __future__ import annotations

import pytest

from stack.bench.vllm import OURS, PATHS, print_report, run_bench
from stack.bench.vllm_server import VllmServer, vllm_python
from tests.vllm_support import check_usable

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_python().exists(), reason="no vLLM venv: run scripts/setup_vllm.sh"),
]


@pytest.mark.timeout(1800)
def test_bench_runs_every_path_interleaved(capsys, vllm_server: VllmServer) -> None:
    url = check_usable(vllm_server).url
    rows = run_bench(short_calls=9, long_calls=1, streaming=(True,), long_tokens=48, concurrency=(1, 2), vllm_url=url)
    assert [(r.shape.name, r.shape.in_flight, r.path) for r in rows] == [
        (shape, n, path) for n in (1, 2) for shape in ("short", "long") for path in PATHS
    ]
    for r in rows:  # two in flight: one round of two conversations per path
        assert len(r.stats.calls) == (9 if r.shape.name == "short" else 1) * r.shape.in_flight
        assert all(c.tokens > 0 and 0 < c.ttft_s <= c.seconds for c in r.stats.calls)
        if r.path == "full" and r.shape.name == "short":  # /proc counts 10 ms ticks
            assert all(r.stats.cpu_s[n] > 0 for n in OURS)
        if r.path == "direct":
            assert r.overhead_ms(50) == 0.0
    print_report(rows)
    out = capsys.readouterr().out
    assert "vllm-path" in out and "targets" in out
