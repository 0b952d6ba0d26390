"""The property-based fuzz of every entry point's body (benchmarks/fuzz_entry_points.py),
at a size that fits the test suite: never a 5xx from the gateway itself, the protocol's
error shape on every 4xx, a record with a status for every request, the process up and
its memory bounded. The benchmark runs the same properties at 100k cases."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz_entry_points.py"


def _fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_entry_points", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_entry_points", module)
    spec.loader.exec_module(module)
    return module


def test_every_entry_point_survives_arbitrary_bodies():
    out = _fuzz().run(cases=400, rss_bound_mb=128.0)
    assert out["failures"] == [], out
    assert out["cases"] == out["records"] == 400
    assert out["records_without_status"] == 0 and out["healthz_after"]
    assert out["statuses"].get(400, 0) > 0  # the bodies were refused, not all served
    assert all(status < 500 for status in out["statuses"])


def test_the_properties_catch_what_they_claim():
    """The checks themselves: a 4xx in the wrong shape, and one in the right shape."""
    fuzz = _fuzz()
    anthropic_error = b'{"type":"error","error":{"type":"invalid_request_error","message":"m"}}'
    openai_error = b'{"error":{"message":"m","type":"invalid_request_error","param":null}}'
    assert fuzz.shape_ok("anthropic", anthropic_error)
    assert fuzz.shape_ok("openai", openai_error)
    assert not fuzz.shape_ok("anthropic", openai_error)
    assert not fuzz.shape_ok("openai", b"internal error")
