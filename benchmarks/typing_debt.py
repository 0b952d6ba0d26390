"""What the type checker still tolerates: modules held to mypy's strict flags, and the
(module, error code) pairs the overrides in ``pyproject.toml`` disable, a package's
wildcard counted once per module it covers. ``--ref`` also counts a git ref.

    python benchmarks/typing_debt.py [--ref REF]
"""

from __future__ import annotations

import argparse
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _covers(pattern: str, module: str) -> bool:
    if pattern.endswith(".*"):
        base = pattern[:-2]
        return module == base or module.startswith(base + ".")
    return module == pattern


def count(pyproject: str, files: list[str]) -> dict[str, int]:
    modules = []
    for f in files:
        parts = f.removeprefix("src/").removesuffix(".py").split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules.append(".".join(parts))
    strict: set[str] = set()
    tolerated: set[tuple[str, str]] = set()
    for override in tomllib.loads(pyproject)["tool"]["mypy"]["overrides"]:
        patterns = override["module"]
        patterns = patterns if isinstance(patterns, list) else [patterns]
        covered = [m for m in modules if any(_covers(p, m) for p in patterns)]
        if override.get("disallow_untyped_defs"):
            strict.update(covered)
        for code in override.get("disable_error_code", []):
            tolerated.update((m, code) for m in covered)
    return {
        "modules": len(modules),
        "strict": len(strict),
        "tolerated pairs": len(tolerated),
        "modules with any tolerated": len({m for m, _ in tolerated}),
    }


def _at(ref: str | None) -> dict[str, int]:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout

    if ref is None:
        files = [str(p.relative_to(ROOT)) for p in (ROOT / "src" / "prefixgate").rglob("*.py")]
        return count((ROOT / "pyproject.toml").read_text(), files)
    files = [
        f
        for f in git("ls-tree", "-r", "--name-only", ref, "src/prefixgate").split()
        if f.endswith(".py")
    ]
    return count(git("show", f"{ref}:pyproject.toml"), files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", help="also count this git ref")
    args = ap.parse_args()
    now = _at(None)
    then = _at(args.ref) if args.ref else None
    print(f"{'':28}{'working tree':>14}" + (f"{'at ' + args.ref:>16}" if then else ""))
    for key, value in now.items():
        print(f"{key:28}{value:>14}" + (f"{then[key]:>16}" if then else ""))


if __name__ == "__main__":
    main()
