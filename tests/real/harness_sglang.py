"""A real SGLang for the end-to-end tests, installed once into the cache folder of
``harness.py`` (``sglang-<version>/``) under the same lock, and started like its vLLM servers.

See the comment below for the two workarounds this takes on CPU machines.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.real.harness import (
    AGENT_MAX_MODEL_LEN,
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    TORCH_VERSION,
    RealSetupError,
    Say,
    VllmServer,
    _offline_env,
    _run_logged,
    cache_dir,
    port_below_the_ephemeral_range,
    venv_once,
)

#
# SGLang 0.5.23 runs on these CPU machines with two workarounds, both made here at install
# time (facts and measurements: docs/engines.md):
#
# - SGLang's CPU kernels (``sgl-kernel`` built for CPU) are not on PyPI: PyPI's
#   ``sglang-kernel`` is one CUDA-only wheel, and the documented CPU build needs SGLang's
#   git sources and gcc 13. With ``SGLANG_USE_CPU_ENGINE=1`` 0.5.23 imports CPU kernel
#   names from ``sgl_kernel`` when it starts, and when the kernels' torch ops are absent it
#   computes with plain PyTorch and the ``torch_native`` attention backend, never calling
#   them. So a stand-in ``sgl_kernel`` answers every name with a function that raises
#   ``NotImplementedError`` naming itself and first prints ``SGL_KERNEL_STANDIN_CALLED``:
#   a version that really calls one fails its request, and :meth:`SglangServer.stop`
#   fails the run when the marker is in the server's log, so it is never silently wrong.
# - PyPI's ``torchvision`` is a CUDA build: next to a CPU torch its ``__init__`` dies
#   registering its ops (``operator torchvision::nms does not exist``), and SGLang imports
#   ``torchvision.transforms`` when it starts (a text-only model never uses it). The
#   import of those registrations is wrapped so that this RuntimeError is ignored.
#
# What runs is SGLang as shipped: its HTTP server, scheduler, radix cache, detokenizer and
# KV-event publisher; only the model's arithmetic takes SGLang's own plain-PyTorch path.

SGLANG_VERSION = "0.5.23"
SGLANG_TORCHVISION = "0.28.0"  # torch 2.13's torchvision
SGLANG_PAGE_SIZE = BLOCK_SIZE
# The KV cache of the servers that publish events: 48 pages of 32 tokens, as the vLLM
# events server's, so that three agent sessions evict each other.
SGLANG_KV_TOKENS = 48 * SGLANG_PAGE_SIZE
# SGLang's declared requirements left out: CUDA kernels and libraries, torch and its media
# companions (torch is pinned to the CPU build above, torchvision installed alone).
_SGLANG_LEFT_OUT = (
    "torch",
    "torchvision",
    "torchaudio",
    "torchcodec",
    "torch-memory-saver",
    "sglang-kernel",
    "sgl-deep-ep",
    "sgl-deep-gemm",
    "sgl-flash-mla",
    "flash-attn-4",
    "flashinfer-python",
    "humming-kernels",
    "quack-kernels",
    "tilelang",
    "apache-tvm-ffi",
    "cuda-python",
    "nvidia-cutlass-dsl",
    "nvidia-mathdx",
    "nvshmem4py-cu13",
    "kernels",
    "av",
    "decord2",
)
# Imported when SGLang starts without being declared in its metadata.
_SGLANG_UNDECLARED = ("IPython", "dill", "soundfile", "msgpack")
SGL_KERNEL_MARKER = "SGL_KERNEL_STANDIN_CALLED"

_SGL_KERNEL_STANDIN = f'''"""A stand-in for SGLang's CPU kernel package, written by prefixgate's test harness.

SGLang 0.5.23 imports these names on CPU but, without the kernels' torch ops, computes
with plain PyTorch and never calls them. Any call fails loudly: it prints
{SGL_KERNEL_MARKER} (the harness fails the run when the server's log holds it) and raises
NotImplementedError naming the function.
"""

import sys


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def standin(*args, **kwargs):
        print("{SGL_KERNEL_MARKER}: sgl_kernel." + name, file=sys.stderr, flush=True)
        raise NotImplementedError(
            "sgl_kernel." + name + " is prefixgate's stand-in: the CPU kernels are not installed"
        )

    standin.__name__ = standin.__qualname__ = name
    return standin
'''


# torchvision 0.28's __init__ imports its op registrations first in one list of modules.
_TORCHVISION_REGISTRATIONS = (
    "from torchvision import (\n    _autograd_registrations,\n    _meta_registrations,\n"
)
_TORCHVISION_TOLERANT = (
    "# prefixgate's test harness: a CUDA torchvision beside a CPU torch cannot register\n"
    "# its ops; SGLang only needs torchvision.transforms to import.\n"
    "try:\n"
    "    from torchvision import _autograd_registrations, _meta_registrations\n"
    "except RuntimeError:\n"
    "    pass\n"
    "from torchvision import (\n"
)


def _patch_torchvision(python: Path) -> None:
    """Wrap torchvision's import of its op registrations (see the comment above)."""
    out = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('torchvision').origin)"],
        capture_output=True,
        text=True,
        check=True,
    )
    init = Path(out.stdout.strip())
    text = init.read_text()
    if _TORCHVISION_REGISTRATIONS not in text:
        raise RealSetupError(f"{init} does not import its op registrations as expected")
    init.write_text(text.replace(_TORCHVISION_REGISTRATIONS, _TORCHVISION_TOLERANT, 1))


def _sglang_requirements(python: Path) -> list[str]:
    """SGLang's own dependency list (its installed metadata), without ``_SGLANG_LEFT_OUT``."""
    script = "import importlib.metadata as m, json;print(json.dumps(m.requires('sglang') or []))"
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, check=True)
    code = (
        "import json, sys\n"
        "from packaging.requirements import Requirement\n"
        "from packaging.utils import canonicalize_name\n"
        "left_out = set(json.loads(sys.argv[2]))\n"
        "keep = []\n"
        "for raw in json.loads(sys.argv[1]):\n"
        "    req = Requirement(raw)\n"
        "    if canonicalize_name(req.name) in left_out:\n"
        "        continue\n"
        "    if req.marker is not None and not req.marker.evaluate({'extra': ''}):\n"
        "        continue\n"
        "    req.marker = None\n"
        "    keep.append(str(req))\n"
        "print(json.dumps(keep))\n"
    )
    left_out = json.dumps(sorted({n.lower() for n in _SGLANG_LEFT_OUT}))
    keep = subprocess.run(
        [str(python), "-c", code, out.stdout.strip(), left_out],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(keep.stdout)


def ensure_sglang(say: Say) -> Path:
    """The Python of a venv with SGLang installed as described above (installed now if it
    is not yet); the stand-in ``sgl_kernel`` is in the venv's ``sgl-kernel-standin/``."""

    def install(python: Path, pip: list[str], log: Path) -> None:
        venv = python.parent.parent
        _run_logged([*pip, "install", f"torch=={TORCH_VERSION}", "packaging"], log, timeout=3000)
        _run_logged(
            [
                *pip,
                "install",
                "--no-deps",
                f"sglang=={SGLANG_VERSION}",
                f"torchvision=={SGLANG_TORCHVISION}",
            ],
            log,
            timeout=1200,
        )
        constraints = venv / "constraints.txt"
        constraints.write_text(f"torch=={TORCH_VERSION}\ntorchvision=={SGLANG_TORCHVISION}\n")
        try:
            requirements = _sglang_requirements(python)
        except subprocess.CalledProcessError as exc:
            raise RealSetupError(f"reading sglang's requirements: {exc.stderr}") from exc
        _run_logged(
            [*pip, "install", "-c", str(constraints), *requirements, *_SGLANG_UNDECLARED],
            log,
            timeout=3000,
        )
        _patch_torchvision(python)
        _write_standin(venv)
        _run_logged(
            [str(python), "-c", "import sglang.srt.entrypoints.http_server"],
            log,
            env={**os.environ, **_sglang_env(venv)},
            timeout=600,
        )

    return venv_once("sglang", SGLANG_VERSION, "sglang", say, install)


def _write_standin(venv: Path) -> None:
    """The stand-in ``sgl_kernel`` in the venv's ``sgl-kernel-standin/`` (rewritten when
    this file's version of it differs, so a fix reaches an installed venv)."""
    init = venv / "sgl-kernel-standin" / "sgl_kernel" / "__init__.py"
    if not init.exists() or init.read_text() != _SGL_KERNEL_STANDIN:
        init.parent.mkdir(parents=True, exist_ok=True)
        init.write_text(_SGL_KERNEL_STANDIN)


def _sglang_env(venv: Path) -> dict[str, str]:
    standin = str(venv / "sgl-kernel-standin")
    path = os.environ.get("PYTHONPATH")
    return {
        **_offline_env(cache_dir()),
        "SGLANG_USE_CPU_ENGINE": "1",
        "PYTHONPATH": standin + (os.pathsep + path if path else ""),
    }


def sglang_kv_events_config(*, bind: bool) -> dict:
    """SGLang's ``--kv-events-config``: ``bind`` has the engine bind its PUB socket on
    every interface (the subscriber connects to it), else the engine connects to a
    concrete address the subscriber binds. Its replay ROUTER binds either way."""
    port = port_below_the_ephemeral_range()
    replay = port_below_the_ephemeral_range()
    return {
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port}" if bind else f"tcp://127.0.0.1:{port}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": "kv-events",
    }


class SglangServer(VllmServer):
    """An SGLang server (``sglang.launch_server``) on a loopback port, as a child process:
    the radix cache at ``SGLANG_PAGE_SIZE`` tokens a page, ``--enable-cache-report`` (its
    ``cached_tokens``) unless ``cache_report`` is false, a KV cache of ``max_total_tokens``."""

    engine = "SGLang"

    def __init__(
        self, *args, cache_report: bool = True, max_total_tokens: int = 4 * MAX_MODEL_LEN, **kw
    ) -> None:
        super().__init__(*args, **kw)
        self.cache_report = cache_report
        self.max_total_tokens = max_total_tokens

    def variant(self) -> str:
        return "" if self.cache_report else " (no cache report)"

    def env(self) -> dict[str, str]:
        venv = self.python.parent.parent
        _write_standin(venv)
        return {**os.environ, **_sglang_env(venv)}

    def command(self) -> list[str]:
        return [
            str(self.python),
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(self.model),
            *self.serving_args(),
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            *(["--enable-cache-report"] if self.cache_report else []),
            "--page-size",
            str(SGLANG_PAGE_SIZE),
            "--max-total-tokens",
            str(self.max_total_tokens),
            "--context-length",
            str(self.max_model_len),
            "--disable-overlap-schedule",
            "--mem-fraction-static",
            "0.1",
            "--tool-call-parser",
            "qwen25",
            *self.extra_args,
        ]

    def stop(self) -> None:
        super().stop()
        if SGL_KERNEL_MARKER in self.log_text():
            raise RealSetupError(
                f"SGLang called a function of the stand-in sgl_kernel (see {self.log}): "
                "this version needs the CPU kernels"
            )


def hoisting_server(python: Path, model: Path, *, log: Path) -> tuple[SglangServer, dict]:
    """SGLang serving ``model`` (the agent model: a 64k window) with the project's
    DeepSeek-like template (``--chat-template``: every system message gathered at the
    head), publishing its KV events (its PUB socket bound, the gateway connects), its KV
    cache three windows large (sessions that recompute every turn never evict); not
    started. The server and its ``--kv-events-config``."""
    from prefixgate.cache.render import template_file

    events = sglang_kv_events_config(bind=True)
    extra = ("--chat-template", str(template_file("hoisting")))
    server = SglangServer(
        python,
        model,
        log=log,
        max_model_len=AGENT_MAX_MODEL_LEN,
        max_total_tokens=3 * AGENT_MAX_MODEL_LEN,
        extra_args=(*extra, "--kv-events-config", json.dumps(events)),
    )
    return server, events
