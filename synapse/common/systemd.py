"""systemd's notify protocol (sd_notify), without libsystemd: READY, STOPPING, WATCHDOG pings.

With `Type=notify`, systemd waits for READY=1 before it counts the service as started; with
`WatchdogSec=`, it restarts a service that stops sending WATCHDOG=1. Outside systemd
($NOTIFY_SOCKET unset) every call does nothing.
"""

from __future__ import annotations

import os
import socket


def notify(message: str) -> bool:
    """Send one notification (e.g. "READY=1"); True if systemd was there to receive it."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), address)
        except OSError:
            return False
    return True


def watchdog_interval() -> float:
    """Seconds between watchdog pings systemd expects (half its WatchdogSec), or 0 when it wants none."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or (pid and pid != str(os.getpid())):
        return 0.0
    return int(usec) / 2e6
