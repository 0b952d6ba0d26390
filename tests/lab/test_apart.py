"""The gateway runs without its lab: no module outside ``prefixgate/lab/`` imports it (but
the CLI's command table and a config-less ``serve``'s embedded upstream, lazily), and
with the lab extra's dependencies missing every gateway module imports and the gateway
serves a request, in a fresh interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "prefixgate"
# Where the gateway may reach into the lab: the CLI's ``demo``/``bench``/``simulate``/
# ``upstream-sim`` commands and the embedded upstream of ``serve`` with no config.
MAY_IMPORT_LAB = {"cli.py", "commands/serve.py"}


def _lab_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [n for n in names if n == "prefixgate.lab" or n.startswith("prefixgate.lab.")]
    return found


def test_no_gateway_module_imports_the_lab():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("lab/") or rel in MAY_IMPORT_LAB:
            continue
        if found := _lab_imports(path):
            offenders[rel] = found
    assert offenders == {}
    assert _lab_imports(PACKAGE / "cli.py"), "the CLI's exception is no longer needed"


def test_the_lab_extra_holds_the_lab_only_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {d.split(">")[0].split("[")[0].split(";")[0].strip() for d in project["dependencies"]}
    lab = project["optional-dependencies"]["lab"]
    assert lab and not names & {d.split(">")[0].strip() for d in lab}
    assert "prefixgate[lab]" in project["optional-dependencies"]["dev"]


_WITHOUT_THE_LAB = """
import importlib, json, pathlib, sys, tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
LAB_ONLY = {d.split(">")[0].split("[")[0].strip() for d in project["optional-dependencies"]["lab"]}


class Absent:  # as if `pip install prefixgate` without the extra
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in LAB_ONLY:
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, Absent())
import prefixgate

root = pathlib.Path(prefixgate.__file__).parent
gateway = [  # from the files: pkgutil.walk_packages would import the lab's packages itself
    ".".join(("prefixgate", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
    for p in sorted(root.rglob("*.py"))
]
gateway = [m for m in gateway if not m.startswith(("prefixgate.lab", "prefixgate.cli"))]
for name in gateway:
    importlib.import_module(name)
lab_loaded = sorted(m for m in sys.modules if m.startswith("prefixgate.lab"))
importlib.import_module("prefixgate.cli")

import httpx
from prefixgate.config import parse_config
from prefixgate.serve.app import create_app
from prefixgate.serve.process import ServerThread
from tests.fakes import ScriptedUpstream

fake = ScriptedUpstream()
with ServerThread(fake.app) as up:
    config = parse_config(
        {"channels": [{"name": "main", "kind": "openai", "base_url": up.url + "/v1"}],
         "store": None}
    )
    with ServerThread(create_app(config)) as gw:
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        )
print(json.dumps({
    "modules": len(gateway),
    "lab_loaded": lab_loaded,
    "status": r.status_code,
    "text": r.json()["choices"][0]["message"]["content"],
    "absent": sorted(m for m in sys.modules if m.partition(".")[0] in LAB_ONLY),
}))
"""


def test_the_gateway_imports_and_serves_without_the_lab_dependencies():
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_THE_LAB],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["modules"] > 100
    assert got["lab_loaded"] == []
    assert got["absent"] == []
    assert (got["status"], got["text"]) == (200, "Hello from upstream")


def test_the_cli_registers_the_lab_commands_without_loading_them():
    """`prefixgate` registers every command at start; a command of the lab (the simulated
    upstream) loads its server only when run, so the gateway's CLI imports no server."""
    probe = (
        "import sys, prefixgate.cli; "
        "print([m for m in ('uvicorn', 'prefixgate.lab.upstream_sim.replicas', "
        "'prefixgate.serve.process') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
