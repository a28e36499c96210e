"""Open streams hold no thread: 200 streams from an upstream that pauses 5 s between chunks leave
/healthz and /v1/lookup answering at once, and a client that goes away closes its upstream request.

The scenario runs in a child pytest process (``test_streams_in_a_child``): its 200 connections, two
servers and their threads shut down with that process, so they cannot slow the tests after it."""
from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time

import httpx
import pytest

from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from infra.runtime import wait_until
from tests.unit.cache_core.helpers import RecordingPublisher
from tests.unit.cache_core.service.chat_stub import StubUpstream
from tests.unit.cache_core.service.test_service_chat_admin import Served

STREAMS = 200
PAUSE_S = 5.0
CHILD = "SCACHE_STREAM_TEST_CHILD"
in_child = pytest.mark.skipif(os.environ.get(CHILD) != "1", reason="run by test_200_slow_streams_... in a child")


def test_200_slow_streams_leave_health_and_lookup_answering_at_once():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           f"{__file__}::test_streams_in_a_child"], env={**os.environ, CHILD: "1"},
                          capture_output=True, text=True, timeout=900)
    print(done.stdout[-600:])
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.fixture()
def upstream():
    with StubUpstream(pause_s=PAUSE_S) as server:
        yield server


@pytest.fixture()
def cache_url(minilm_embedder, upstream):
    settings = Settings(service={"open_access": True, "upstream_url": f"http://127.0.0.1:{upstream.port}/v1"})
    app = create_app(build_components(settings, RecordingPublisher(), minilm_embedder, expiry_sweep_s=None))
    with Served(app, "cache under test") as server:
        yield f"http://127.0.0.1:{server.port}"


async def _timed(call) -> float:
    started = time.perf_counter()
    response = await call()
    assert response.status_code == 200, response.text
    return time.perf_counter() - started


@in_child
def test_streams_in_a_child(cache_url, upstream):
    async def scenario() -> dict:
        release = asyncio.Event()
        opened = 0
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=cache_url, limits=limits, timeout=60) as streams, \
                httpx.AsyncClient(base_url=cache_url, timeout=10) as probe:

            async def hold(i: int) -> None:
                nonlocal opened
                body = {"model": "m", "stream": True,
                        "messages": [{"role": "user", "content": f"Question number {i} about streams"}]}
                async with streams.stream("POST", "/v1/chat/completions", json=body) as response:
                    assert response.status_code == 200 and response.headers["x-scache-hit"] == "0"
                    lines = response.aiter_lines()
                    while not (await lines.__anext__()).startswith("data:"):
                        pass  # the first event (the role) is relayed at once
                    opened += 1
                    await release.wait()  # then leave mid-stream: the upstream request must close

            holders = [asyncio.create_task(hold(i)) for i in range(STREAMS)]
            deadline = time.monotonic() + 60
            while upstream.open_streams < STREAMS and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            reached = upstream.open_streams
            health = [await _timed(lambda: probe.get("/healthz")) for _ in range(10)]
            lookup = [await _timed(lambda: probe.post("/v1/lookup", json={"query": "how do streams work",
                                                                          "unit_id": "u"})) for _ in range(10)]
            release.set()
            await asyncio.gather(*holders)
            return {"reached": reached, "opened": opened, "health": health, "lookup": lookup}

    abandoned_before = upstream.abandoned_streams
    figures = asyncio.run(scenario())
    health_ms = [1000 * s for s in figures["health"]]
    lookup_ms = [1000 * s for s in figures["lookup"]]
    print(f"\n{figures['reached']} streams at the upstream; /healthz median {statistics.median(health_ms):.1f} ms "
          f"max {max(health_ms):.1f} ms; /v1/lookup median {statistics.median(lookup_ms):.1f} ms "
          f"max {max(lookup_ms):.1f} ms")
    assert figures["reached"] == STREAMS and figures["opened"] == STREAMS, figures
    assert statistics.median(health_ms) < 100 and statistics.median(lookup_ms) < 100, (health_ms, lookup_ms)
    # every client left mid-stream: each upstream request was closed, none ran its 5 s pauses to the end
    wait_until(lambda: upstream.abandoned_streams - abandoned_before == STREAMS and upstream.open_streams == 0,
               PAUSE_S * 6, f"upstream requests closed ({upstream.abandoned_streams - abandoned_before} of {STREAMS}, "
                            f"{upstream.open_streams} open)")
