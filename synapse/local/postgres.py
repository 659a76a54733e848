"""A throwaway PostgreSQL server for the history tests, bench/history.py and the chaos suite: Debian's
`postgresql` package (scripts/install-test-packages.sh), initdb into a temporary directory, listening
on 127.0.0.1 on a free port and a private socket directory, stopped and removed afterwards.
`url(db)` reaches it over TCP on loopback; `socket_url(db)` over its Unix socket, which a process in
another network namespace (the masters of a `--netns` cluster) still reaches: namespaces part the
network, not the file system.

PostgreSQL refuses to run as root: as root, the server runs as the `postgres` user the package
creates (runuser). Where it cannot run, `unavailable()` says why and the callers skip."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _bin_dir() -> str:
    found = shutil.which("initdb")
    if found:
        return str(Path(found).resolve().parent)
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return str(Path(versions[-1]).parent) if versions else ""


def unavailable() -> str:
    """Why no server can be started here, or ''."""
    if not _bin_dir():
        return "PostgreSQL is not installed (run scripts/install-test-packages.sh as root)"
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root without runuser: PostgreSQL will not run as root"
        if subprocess.run(["id", "-u", "postgres"], capture_output=True).returncode != 0:
            return "running as root and no postgres user to run the server as"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # (host, port) for AF_INET
        return port


class PostgresServer:
    """One server; `url(db)` names a database on it, `create(db)` makes one."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="synapse-pg-"))
        self.port = _free_port()
        self.bin = _bin_dir()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-t", "30", "-o",
                  f"-h 127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off -c full_page_writes=off", "start")
        self.running = True

    def _run(self, tool: str, *args: str) -> None:
        argv = [os.path.join(self.bin, tool), *args]
        if self.as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=self.dir)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr.strip() or done.stdout.strip()}")

    def url(self, db: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{db}"

    def socket_url(self, db: str = "postgres") -> str:
        """The same database through the server's Unix socket (its directory, `-k`)."""
        return f"postgresql+psycopg://postgres@/{db}?host={self.dir}&port={self.port}"

    def create(self, db: str) -> str:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{db}"')
        return self.url(db)

    def stop(self) -> None:
        """Stop the server (fast: connections are cut); `start` brings it back on the same port."""
        if self.running:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")
            self.running = False

    def start(self) -> None:
        if not self.running:
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-t", "30", "-o",
                      f"-h 127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off -c full_page_writes=off", "start")
            self.running = True

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
