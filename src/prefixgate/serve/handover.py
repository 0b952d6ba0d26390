"""Handing the listening port over to a successor process without refusing or resetting a
connection (an upgrade: docs/operating.md).

Every gateway binds its port with ``SO_REUSEPORT``, so a new process can listen on the
same port while the old one still serves. The kernel spreads new connections over every
listening socket of the port by a hash, and a connection it has put in a socket's accept
queue is reset when that socket closes. So a process that stops, before it closes its
listening sockets, attaches a classic BPF program to the port's socket group that sends
new connections to the sockets bound after its own (its successor's): its accept queue
then only empties. It keeps accepting (and serving) until the queue has stayed empty for
a moment, closes, and drains the requests it carries.

The group's sockets are numbered in the order they listened, a closed one's place taken
by the last: the old process's sockets are the first ``ours`` of the group when it is the
oldest generation on the port. The program picks among the ``theirs`` sockets after them
at random; an index past the group's end makes the kernel fall back to its hash (so with
no successor the program changes nothing, and once the old sockets are gone the group is
spread by hash again when ``theirs`` is not more than ``ours``). The successor is
expected to run as many workers as the old process (``theirs`` defaults to ``ours``).
"""

from __future__ import annotations

import ctypes
import logging
import socket
import struct

log = logging.getLogger("prefixgate")

SO_ATTACH_REUSEPORT_CBPF = 51  # linux/asm-generic/socket.h

# Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
_LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
_ALU_MOD_K = 0x04 | 0x90 | 0x00  # BPF_ALU | BPF_MOD | BPF_K
_ALU_ADD_K = 0x04 | 0x00 | 0x00  # BPF_ALU | BPF_ADD | BPF_K
_RET_A = 0x06 | 0x10  # BPF_RET | BPF_A
_RET_K = 0x06 | 0x00  # BPF_RET | BPF_K
_SKF_AD_RANDOM = -0x1000 + 56  # SKF_AD_OFF + SKF_AD_RANDOM: a random u32 in A


def program(ours: int, theirs: int) -> list[tuple[int, int, int, int]]:
    """The filter: the index of one of the ``theirs`` sockets after the first ``ours``."""
    if theirs <= 1:
        return [(_RET_K, 0, 0, ours)]
    return [
        (_LD_W_ABS, 0, 0, _SKF_AD_RANDOM & 0xFFFFFFFF),
        (_ALU_MOD_K, 0, 0, theirs),
        (_ALU_ADD_K, 0, 0, ours),
        (_RET_A, 0, 0, 0),
    ]


def steer_to_successor(sock: socket.socket, ours: int = 1, theirs: int | None = None) -> bool:
    """Attach the program to ``sock``'s group; False (said in the log) where the kernel
    refuses it (not Linux, an old kernel): the stop then behaves as before."""
    insns = program(ours, theirs if theirs is not None else ours)
    raw = b"".join(struct.pack("HBBI", *i) for i in insns)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("@HP", len(insns), ctypes.addressof(buf))
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)
    except OSError as exc:
        log.warning("cannot hand the port over to a successor (SO_ATTACH_REUSEPORT_CBPF): %s", exc)
        return False
    return True


def queued(sock: socket.socket) -> bool:
    """Whether a connection waits in ``sock``'s accept queue, without taking it: a
    listening socket polls readable while its queue is not empty."""
    import select

    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


__all__ = ["program", "queued", "steer_to_successor"]
