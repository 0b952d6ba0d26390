"""Speed of ``prefixgate simulate`` on the Mooncake FAST'25 traces.

Prints, for each trace: the seconds to replay it end to end (parse + replay) with
unlimited capacity, the hit ratios that replay gives (both conventions), and the seconds
for a 10-point GPU-capacity sweep with a host tier. Targets: conversation trace (12,031
requests) in at most 5 s unlimited, a 10-point sweep in at most 30 s.

    .venv/bin/python benchmarks/simulate_mooncake.py [--data DIR] [--json]

DIR holds ``conversation_trace.jsonl`` and ``synthetic_trace.jsonl``, plain or ``.xz``; by
default the copies kept under tests/fixtures/mooncake (unpacked before the clock starts).
"""

from __future__ import annotations

import argparse
import json
import lzma
import platform
import shutil
import tempfile
import time
from pathlib import Path

from prefixgate.lab.simulate import run_simulation

DATA = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mooncake"
SWEEP = ["1M", "2M", "4M", "8M", "16M", "32M", "64M", "128M", "256M", "unlimited"]


def trace(data: Path, name: str, tmp: Path) -> Path:
    """The plain JSONL of one trace: as it is in ``data``, or unpacked from its ``.xz``."""
    plain = data / f"{name}_trace.jsonl"
    if plain.is_file():
        return plain
    out = tmp / plain.name
    with lzma.open(plain.with_name(plain.name + ".xz")) as src, out.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def bench(path: Path) -> dict[str, float | int | str | None]:
    start = time.perf_counter()
    result = run_simulation(str(path), keep_rows=False)
    unlimited_s = time.perf_counter() - start
    st = result.main.stats
    start = time.perf_counter()
    run_simulation(str(path), sweep=SWEEP, host_capacity_tokens="64M", keep_rows=False)
    sweep_s = time.perf_counter() - start
    return {
        "trace": path.name,
        "requests": st.requests,
        "unlimited_seconds": round(unlimited_s, 3),
        "sweep_points": len(SWEEP),
        "sweep_seconds": round(sweep_s, 3),
        "id_hit_ratio": st.id_hit_ratio,
        "vllm_token_hit_rate": st.token_hit_rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="directory of the traces")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench(trace(args.data, name, Path(tmp))) for name in ("conversation", "synthetic")]
    if args.json:
        print(json.dumps({"python": platform.python_version(), "results": rows}, indent=2))
        return
    for r in rows:
        print(
            f"{r['trace']:<26} {r['requests']:>6} requests  unlimited {r['unlimited_seconds']:>6.2f} s"
            f"  sweep x{r['sweep_points']} {r['sweep_seconds']:>6.2f} s"
            f"  ids {100 * float(r['id_hit_ratio'] or 0):.1f}%"
            f"  vLLM tokens {100 * float(r['vllm_token_hit_rate'] or 0):.1f}%"
        )


if __name__ == "__main__":
    main()
