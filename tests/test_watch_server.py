"""`testbed watch`'s server on loopback: the page and its bundled files, the snapshot, and the event
stream (a snapshot, then a delta when the run writes a round)."""

from __future__ import annotations

import asyncio
import json
import re


from conftest import require_module

require_module("aiohttp", "watch")

from aiohttp.test_utils import TestClient, TestServer  # noqa: E402

from testbed.assembly.config import load_config_text  # noqa: E402
from testbed.orchestration.runner import run_experiment  # noqa: E402
from testbed.watch.feed import RunFeed  # noqa: E402
from testbed.watch.server import STATIC, WatchApp  # noqa: E402


async def _next_event(stream) -> tuple[str, dict]:
    """The next server-sent event: (its name, its JSON data)."""
    name, data = None, []
    while True:
        line = (await asyncio.wait_for(stream.readline(), 10)).decode().rstrip("\r\n")
        if line.startswith("event:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            data.append(line.split(":", 1)[1].strip())
        elif line == "" and data:
            return name, json.loads("\n".join(data))


def test_page_snapshot_and_events(tmp_path, small_config_text):
    result = run_experiment(load_config_text(small_config_text), out_dir=tmp_path / "done", quiet=True)
    live = tmp_path / "live"
    live.mkdir()
    (live / "config.toml").write_bytes((result.run_dir / "config.toml").read_bytes())
    metrics = (result.run_dir / "metrics.csv").read_bytes().splitlines(keepends=True)

    async def scenario() -> None:
        app = WatchApp(RunFeed(live), poll_s=0.05)
        async with TestClient(TestServer(app.app, host="127.0.0.1")) as client:
            page = await (await client.get("/")).text()
            for src in re.findall(r'(?:src|href)="([^"]+)"', page):
                if src.startswith("data:"):  # inline (the empty favicon)
                    continue
                assert src.startswith("/static/"), src  # nothing from a CDN
                assert (await client.get(src)).status == 200
            assert (await client.get("/static/uPlot.LICENSE")).status == 200
            snap = await (await client.get("/api/snapshot")).json()
            assert snap["run"]["status"] in ("waiting", "running") and snap["metrics"] == []
            resp = await client.get("/api/events")
            name, first = await _next_event(resp.content)
            assert name == "snapshot" and len(first["nodes"]) == 4
            (live / "metrics.csv").write_bytes(metrics[0] + metrics[1])
            while True:
                name, delta = await _next_event(resp.content)
                assert name == "delta" and delta["version"] > first["version"]
                if delta["metrics"]:
                    break
            assert delta["metrics"][0]["round"] == 1.0 and delta["run"]["rounds_done"] == 1
            resp.close()

    asyncio.run(scenario())


def test_bundled_chart_library_and_its_licence():
    assert (STATIC / "uPlot.iife.min.js").stat().st_size > 10_000
    assert "MIT" in (STATIC / "uPlot.LICENSE").read_text()
