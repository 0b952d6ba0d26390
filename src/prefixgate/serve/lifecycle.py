"""A serving process as an operator drives it: ``SIGHUP`` reloads the config
(``reload.py``), the pid file says which process to signal and that it is ready, and
systemd hears ``READY=1`` (``Type=notify``) once the port is served
(docs/operating.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from prefixgate.config import Config, ConfigError

log = logging.getLogger("prefixgate")


class Lifecycle:
    """``load``: reads and validates the config again (None: started without a file, so
    there is nothing to reload); ``pid_file``: written once the port is served (the pid of
    the process to signal: the parent with ``--workers``), removed at exit if still ours."""

    def __init__(
        self,
        load: Callable[[], Config] | None,
        pid_file: str | None = None,
        *,
        pid: int | None = None,
        announce: bool = True,
    ) -> None:
        self.load = load
        self.pid_file = Path(pid_file) if pid_file else None
        self.pid = pid or os.getpid()
        self.announce = announce  # this process writes the pid file and tells systemd
        self.gateway = None
        self._reloading: asyncio.Task | None = None
        self._installed = False

    # -- start and stop ------------------------------------------------------------------
    def started(self) -> None:
        if not self.announce:
            return
        if self.pid_file is not None:
            tmp = self.pid_file.with_name(self.pid_file.name + f".{os.getpid()}")
            tmp.write_text(f"{self.pid}\n")
            tmp.replace(self.pid_file)  # whole or absent, never half written
        notify(f"READY=1\nMAINPID={self.pid}")

    def stopped(self) -> None:
        if not self.announce or self.pid_file is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if int(self.pid_file.read_text().strip()) == self.pid:  # not a successor's
                self.pid_file.unlink()

    # -- SIGHUP ------------------------------------------------------------------------------
    def install(self, gateway) -> None:
        """Reload on SIGHUP from now on (the main thread's loop only)."""
        self.gateway = gateway
        if threading.current_thread() is not threading.main_thread():
            return
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.hangup)
        self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._installed = False

    def hangup(self) -> None:
        if self._reloading is not None and not self._reloading.done():
            log.warning("SIGHUP: a reload is already under way; this one is ignored")
            return
        self._reloading = asyncio.get_running_loop().create_task(self.reload())

    async def reload(self):
        """Read the config again and swap it in; a file that does not parse or validate
        is refused with its reason and the old config keeps serving."""
        from prefixgate.reload import ReloadResult

        gw = self.gateway
        if self.load is None:
            log.warning("SIGHUP: started without --config, nothing to reload")
            return None
        try:
            config = await asyncio.to_thread(self.load)
        except (ConfigError, ValueError, OSError) as exc:
            result = ReloadResult(False, gw.live.generation, reason=str(exc))
            gw.reloads.add(result)
            log.error("reload refused, generation %d keeps serving: %s", gw.live.generation, exc)
            return result
        return await gw.reload(config)


def notify(state: str) -> bool:
    """Tell systemd (``NOTIFY_SOCKET``, ``Type=notify``); False when not under systemd."""
    where = os.environ.get("NOTIFY_SOCKET")
    if not where:
        return False
    address = "\0" + where[1:] if where.startswith("@") else where
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(state.encode(), address)
    except OSError as exc:
        log.warning("cannot notify systemd at %s: %s", where, exc)
        return False
    return True


__all__ = ["Lifecycle", "notify"]
