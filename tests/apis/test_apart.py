"""Each client API is one package under ``apis/``: the request path every API shares
(``pipeline/``) knows none of their steps or endpoints (only ``API_OF``, the rules the
``diagnose`` step asks), so adding an API touches nothing there; one API's package takes
nothing of another's but the Messages conversion the others build on; and no module
imports another module's private names. Read from the sources (every import, those in
functions and under ``TYPE_CHECKING`` too)."""

from __future__ import annotations

import ast
from pathlib import Path

import prefixgate
from prefixgate.serve.app import INFERENCE

PACKAGE = Path(prefixgate.__file__).parent


def _imports(path: Path, package: Path = PACKAGE):
    """(module, names) of each import in ``path`` (a module of ``package``), absolute."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = path.relative_to(package.parent).with_suffix("").parts
                base = list(parts[: len(parts) - node.level])
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def test_the_shared_pipeline_imports_no_apis_steps_or_endpoints():
    wrong = {
        f"{path.name}: {module}"
        for path in (PACKAGE / "pipeline").glob("*.py")
        for module, names in _imports(path)
        if module.startswith("prefixgate.apis") and module != "prefixgate.apis"
    }
    wrong |= {
        f"{path.name}: prefixgate.apis.{name}"
        for path in (PACKAGE / "pipeline").glob("*.py")
        for module, names in _imports(path)
        if module == "prefixgate.apis"
        for name in names
        if name != "API_OF"
    }
    assert not wrong, sorted(wrong)


def test_an_api_takes_of_another_only_the_messages_conversion():
    apis = sorted(p.name for p in (PACKAGE / "apis").iterdir() if (p / "api.py").is_file())
    assert apis == ["chat", "messages", "responses"]
    shared = {"prefixgate.apis.messages.request"}  # ConvertOptions, plain: Chat's shapes
    wrong = set()
    for api in apis:
        for path in (PACKAGE / "apis" / api).glob("*.py"):
            for module, _ in _imports(path):
                other = module.split(".")[2] if module.startswith("prefixgate.apis.") else None
                if other in apis and other != api and module not in shared:
                    wrong.add(f"apis/{api}/{path.name}: {module}")
    assert not wrong, sorted(wrong)


def test_no_module_imports_another_modules_private_names():
    wrong = {
        f"{path.relative_to(PACKAGE)}: {module}.{name}"
        for path in PACKAGE.rglob("*.py")
        for module, names in _imports(path)
        if module.startswith("prefixgate")
        for name in names
        if name.startswith("_") and not name.startswith("__")
    }
    assert not wrong, sorted(wrong)


def test_every_routed_endpoint_is_an_apis_endpoint():
    for path, endpoint in INFERENCE:
        steps_module = endpoint.steps[-1].__module__
        assert steps_module.startswith("prefixgate.apis."), (path, steps_module)
        assert steps_module.endswith(".steps") or steps_module.endswith(".count"), path


def test_the_reading_sees_what_the_checks_must_refuse(tmp_path):
    package = tmp_path / "prefixgate"
    bad = package / "pipeline" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..apis.messages.steps import relay_messages\n"
        "def f():\n    from prefixgate.record.cut import _private\n"
    )
    found = dict(_imports(bad, package))
    assert found["prefixgate.apis.messages.steps"] == ["relay_messages"]
    assert found["prefixgate.record.cut"] == ["_private"]
