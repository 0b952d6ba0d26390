"""The gateway's footprint without the lab: its installed size and its import time.

    python benchmarks/footprint.py [--ref GIT_REF] [--runs 15] [--json]

Installs the package as an operator would, ``pip install .`` with no extra (the lab's
dependencies are in ``.[lab]``), into a fresh virtual environment, then reports:

- the size on disk of everything installed (the environment's ``site-packages``), of the
  ``prefixgate`` package alone, and the number of distributions installed;
- the import time of what a serving process imports (``prefixgate.cli`` and the ASGI app,
  ``prefixgate.serve.app``): the least of ``--runs`` fresh interpreters (the least is the
  one a busy machine disturbed least), each measured by ``python -X importtime`` (its
  cumulative figure for the modules named, so the interpreter's own start-up is not
  counted).

``--ref`` measures the package as it was at a git ref (checked out into a temporary
worktree) beside the working tree. The wheels come from pip's configured index; nothing
else is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMPORTS = ("prefixgate.cli", "prefixgate.serve.app")


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _import_us(python: Path, runs: int) -> float:
    """The least cumulative import time of IMPORTS over ``runs``, in microseconds."""
    code = "; ".join(f"import {name}" for name in IMPORTS)
    times = []
    for _ in range(runs):
        out = subprocess.run(
            [str(python), "-X", "importtime", "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=tempfile.gettempdir(),
        ).stderr
        total = 0
        for line in out.splitlines():
            # "import time:   self [us] | cumulative | imported package"
            parts = line.split("|")
            if len(parts) == 3 and parts[2].strip() in IMPORTS:
                total += int(parts[1])
        times.append(total)
    return min(times)


def measure(source: Path, runs: int) -> dict[str, float]:
    """Install ``source`` (a checkout) without extras into a fresh venv and measure it."""
    work = Path(tempfile.mkdtemp(prefix="prefixgate-footprint-"))
    try:
        # A copy to build from: pip builds in the tree it is given, and leaves build/ there.
        copy = work / "source"
        shutil.copytree(
            source,
            copy,
            ignore=shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "tests"),
        )
        subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True)
        python = work / "venv" / "bin" / "python"
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", str(copy)],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        site = next((work / "venv" / "lib").glob("python*/site-packages"))
        pip_list = subprocess.run(
            [str(python), "-m", "pip", "list", "--format=json"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout
        return {
            "site_packages_mb": _size(site) / 1e6,
            "prefixgate_mb": _size(site / "prefixgate") / 1e6,
            "distributions": len(json.loads(pip_list)),
            "import_ms": _import_us(python, runs) / 1000,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _at_ref(ref: str, runs: int) -> dict[str, float]:
    tree = Path(tempfile.mkdtemp(prefix="prefixgate-ref-")) / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
        check=True,
        capture_output=True,
    )
    try:
        return measure(tree, runs)
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
            check=False,
            capture_output=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", help="also measure the package at this git ref")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    if args.ref:
        results[args.ref] = _at_ref(args.ref, args.runs)
    results["working tree"] = measure(ROOT, args.runs)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    fields = {
        "site_packages_mb": "installed, MB",
        "prefixgate_mb": "the package, MB",
        "distributions": "distributions",
        "import_ms": "import, ms",
    }
    names = list(results)
    print(f"{'':<18}" + "".join(f"{n[:16]:>18}" for n in names))
    for key, label in fields.items():
        print(f"{label:<18}" + "".join(f"{results[n][key]:>18.2f}" for n in names))


if __name__ == "__main__":
    main()
