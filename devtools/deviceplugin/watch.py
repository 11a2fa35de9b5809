"""Tell when kubelet's registration socket is created again: the signal both real plugins restart and re-register on.

kubelet, when it starts, removes every socket in its device-plugin directory (its own and the plugins',
`CleanupPluginDirectory`, pkg/kubelet/cm/devicemanager/manager.go:187-219 at v1.34.1) and listens on `kubelet.sock`
anew; a plugin learns of it by watching the directory with inotify (fsnotify) for the creation of that one name
(gpushare-device-plugin `pkg/gpu/nvidia/gpumanager.go:83-87`; HAMi v2.10.0 `cmd/device-plugin/nvidia/main.go:314-318`).
This is the same watch, on Linux's inotify through ctypes (the standard library has none), read on the event loop.
Like fsnotify's, a watch on a directory that is itself removed ends (IN_IGNORED): neither real plugin watches again.
It never polls and never touches the directory.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080
IN_IGNORED = 0x00008000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
HEADER = struct.Struct("iIII")
"""struct inotify_event: wd, mask, cookie, len; then `len` bytes of NUL-padded name."""


class SocketWatch:
    """Creations of `name` in `directory`, one `asyncio.Event` set per creation. Mutable: `created` is cleared by
    whoever consumes it. Close it when done."""

    def __init__(self, directory: Path, name: str) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        mask = IN_CREATE | IN_MOVED_TO
        if libc.inotify_add_watch(self._fd, os.fsencode(directory), mask) < 0:
            error = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(error, f"inotify_add_watch {directory}")
        self._name = os.fsencode(name)
        self.created = asyncio.Event()
        self.ended = False
        """The directory itself went away: no more events (as fsnotify's watch)."""
        asyncio.get_running_loop().add_reader(self._fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        offset = 0
        while offset + HEADER.size <= len(data):
            _, mask, _, length = HEADER.unpack_from(data, offset)
            name = data[offset + HEADER.size : offset + HEADER.size + length].rstrip(b"\0")
            offset += HEADER.size + length
            if mask & IN_IGNORED:
                self.ended = True
            elif name == self._name:
                self.created.set()

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self._fd)
        os.close(self._fd)
