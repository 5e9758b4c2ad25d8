"""Iceberg's own REST catalog server for the tests, started by us: org.apache.iceberg.rest.RESTCatalogServer.

It is the server of Iceberg's REST compatibility kit (iceberg-open-api's test fixtures): Iceberg's reference
REST adapter over a JdbcCatalog. RestCatalogServer puts that JdbcCatalog on a SQLite FILE and a file://
warehouse in its work directory, so a stopped server started again serves the same tables. The server takes
its settings from CATALOG_* environment variables (RCKUtils.environmentCatalogConfig: CATALOG_X_Y -> x.y,
"__" -> "-"): a free port, the JDBC URI and the warehouse. Its log goes to a file in the work directory and is
quoted by `RestCatalogError`. `start()` waits until GET /v1/config answers; `stop()` sends SIGTERM.

Jetty binds the port on every interface (RESTCatalogServer takes no host) with SO_REUSEPORT, so a second
server given the same port would share it silently: `start()` checks, where /proc/net/tcp* exists, that one
socket listens on the port, and otherwise starts again on another (as it does when the port was taken).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from . import jars

HANG_S = 180.0  # a guard against a hang only: every wait below is on a condition
MAIN_CLASS = "org.apache.iceberg.rest.RESTCatalogServer"
PORT_ATTEMPTS = 3
READY_LINE = "Started oejs.Server@"  # Jetty's last line once the connector listens
BIND_ERROR = "java.net.BindException"


class RestCatalogError(RuntimeError):
    """The server failed to start, died or would not stop; the message quotes the server's log."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening_sockets(port: int) -> int | None:
    """How many sockets listen on this TCP port, as /proc/net shows our network namespace; None without /proc."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not any(t.exists() for t in tables):
        return None
    count = 0
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # fields[1] is local "ADDR:PORT" in hex, fields[3] the state: 0A is LISTEN
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


class RestCatalogServer:
    """One RESTCatalogServer whose catalog (catalog.db) and warehouse (warehouse/) live in `workdir`."""

    def __init__(self, workdir: str | os.PathLike, heap: str = "512m", env: dict[str, str] | None = None):
        self.workdir = Path(workdir)
        self.catalog_db = self.workdir / "catalog.db"
        self.warehouse_dir = self.workdir / "warehouse"
        self.log_file = self.workdir / "server.log"
        self.heap = heap
        self.extra_env = dict(env or {})  # more CATALOG_* settings, e.g. {"CATALOG_INCLUDE__CREDENTIALS": "true"}
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self._log_start = 0

    # ---- lifecycle ----

    @property
    def uri(self) -> str:
        """The REST catalog's base URI, for pyiceberg (`load_catalog(..., type="rest", uri=...)`) or Spark."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> str:
        return self.warehouse_dir.resolve().as_uri()

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CATALOG_")}  # only ours reach the server
        env.update(
            {
                "CATALOG_URI": f"jdbc:sqlite:file:{self.catalog_db.resolve()}",
                "CATALOG_WAREHOUSE": self.warehouse,
                "CATALOG_REST_PORT": str(self.port),
                **self.extra_env,
            }
        )
        return env

    def start(self) -> RestCatalogServer:
        """Start the server on a free port and wait until GET /v1/config answers."""
        if self.running:
            raise RestCatalogError(f"the server already runs on {self.uri}")
        classpath = jars.rest_catalog_classpath()  # Unavailable, naming what is missing, unless cached
        if shutil.which("java") is None:
            raise jars.Unavailable(f"{jars.NEEDS}; missing: java")
        self.warehouse_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(PORT_ATTEMPTS):
            self.port = _free_port()
            self._log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
            cmd = ["java", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", classpath]
            with open(self.log_file, "ab") as log:
                self.proc = subprocess.Popen(
                    [*cmd, MAIN_CLASS],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._env(),
                    cwd=self.workdir,
                    start_new_session=True,
                )
            try:
                self._wait(self._answers, f"GET {self.uri}/v1/config to answer")
            except RestCatalogError:
                if self.proc.poll() is not None and BIND_ERROR in self.log_since_start():
                    continue  # another process took the port after _free_port() let it go
                raise
            listeners = _listening_sockets(self.port)
            if listeners is None or listeners <= 1:
                return self
            self.stop()  # another server listens on this port too (SO_REUSEPORT): try another one
        raise RestCatalogError(f"no free port in {PORT_ATTEMPTS} attempts\n" + self.log_tail())

    def ensure_running(self) -> RestCatalogServer:
        """Start the server unless it runs (tests sharing it may have stopped it)."""
        if not self.running:
            self.start()
        return self

    def config(self) -> dict:
        """The server's answer to GET /v1/config."""
        with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=10) as response:
            return json.load(response)

    def _answers(self) -> bool:
        if READY_LINE not in self.log_since_start():  # not some other process answering on the port
            return False
        try:
            return isinstance(self.config(), dict)
        except (OSError, ValueError):  # not listening yet (URLError is an OSError), or a half-written answer
            return False

    def _wait(self, condition, what: str) -> None:
        deadline = time.monotonic() + HANG_S
        while not condition():
            if self.proc is not None and self.proc.poll() is not None:
                raise RestCatalogError(
                    f"the REST catalog server exited ({self.proc.returncode}) while waiting for {what}\n"
                    + self.log_tail()
                )
            if time.monotonic() > deadline:
                raise RestCatalogError(f"no sign of {what} after {HANG_S:.0f} s (a hang)\n" + self.log_tail())
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM to the server's PID (Jetty stops on the JVM's shutdown), then wait for it to exit."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(HANG_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                raise RestCatalogError("the REST catalog server did not stop on SIGTERM\n" + self.log_tail()) from None
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> RestCatalogServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- its log ----

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def log_since_start(self) -> str:
        if not self.log_file.exists():
            return ""
        with open(self.log_file, "rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        tail = self.log_text().splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.log_file} ---\n" + "\n".join(tail)
