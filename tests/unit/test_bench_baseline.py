"""bench/baseline.py as the harness starts it, on either event loop: each route answers
its shape, with a fresh request ID."""

import json
import urllib.request
from pathlib import Path

import pytest

from bench.baseline import ROUTES, Shape
from bench.servers import start_baseline

SHAPE = Shape(200, {"Content-Type": "application/json; charset=utf-8"}, b'{"status": 200}')


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_baseline_answers_its_shape_on_either_loop(tmp_path: Path, loop: str) -> None:
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({name: SHAPE.as_json() for name in ROUTES}))
    with start_baseline(shapes, tmp_path / "baseline.log", loop) as server:
        ids = set()
        for _ in range(2):
            with urllib.request.urlopen(server.base + "/v1/verify", timeout=10) as answer:
                assert (answer.status, answer.read()) == (200, SHAPE.body)
                ids.add(answer.headers["X-Request-Id"])
        assert len(ids) == 2
        server.check_alive()
