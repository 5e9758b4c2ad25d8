"""A real S3 endpoint for tests: moto's S3 app served over HTTP on 127.0.0.1 (port 0) in a thread.

Spark workers are other processes, so this is a server, not an in-process mock. Tests reach it through
the fixtures in tests/conftest.py: s3_server, s3_root, s3_faults.

Two additions over moto's ThreadedMotoServer (same app, same werkzeug server):
- Object writes are serialized. Moto checks If-None-Match and then stores the object as two steps,
  so two concurrent conditional PUTs can both succeed (seen with moto 5.2.1 under forced thread
  switches); S3 decides them atomically, and the tests need S3's semantics.
- A request log (method, key path, Range, status, body bytes) to count what a call really sent.
- Injected faults (S3Server.add_fault): a matching request gets an S3 error instead of reaching moto,
  optionally after being held until the test releases it (to kill a client between two writes).
"""

from __future__ import annotations

import re
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

BUCKET = "kafkalog-test"
ACCESS_KEY = "testing-access-key"
SECRET_KEY = "testing-secret-key"
REGION = "us-east-1"
_MUTATING = frozenset({"PUT", "POST", "DELETE"})


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # /bucket/key, unquoted
    query: str
    range: str | None
    status: int
    body_bytes: int  # bytes in the response body


class RequestLog:
    """Requests the server answered, in order. Thread-safe."""

    def __init__(self):
        self._items: list[Request] = []
        self._guard = threading.Lock()

    def add(self, r: Request) -> None:
        with self._guard:
            self._items.append(r)

    def mark(self) -> int:
        with self._guard:
            return len(self._items)

    def since(self, mark: int, *, path_prefix: str | None = None) -> list[Request]:
        with self._guard:
            items = self._items[mark:]
        if path_prefix is not None:
            items = [r for r in items if r.path.startswith(path_prefix)]
        return items


@dataclass
class Fault:
    """Requests whose method matches and whose /bucket/key path matches `path` (re.search) fail with
    `status`/`code`, after the first `after` matches passed through, for `times` matches. With `hold`, a
    failing request first waits (up to 120 s) for release(): `arrived` is set when one is held."""

    method: str
    path: str
    status: int = 403
    code: str = "AccessDenied"
    after: int = 0
    times: int = 1
    hold: bool = False
    seen: int = 0
    failed: int = 0
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()

    def _claims(self, method: str, path: str) -> bool:
        """Called under the app's fault lock: whether this request is one to fail."""
        if method != self.method or not re.search(self.path, path):
            return False
        self.seen += 1
        if self.seen <= self.after or self.failed >= self.times:
            return False
        self.failed += 1
        return True


class _App:
    """Wraps moto's WSGI app: one object write at a time, and every request logged."""

    def __init__(self, app, log: RequestLog):
        self._app = app
        self._log = log
        self._writes = threading.Lock()
        self.faults: list[Fault] = []
        self._fault_guard = threading.Lock()

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._fault_guard:
            return next((f for f in self.faults if f._claims(method, path)), None)

    def _fail(self, fault: Fault, environ, start_response):
        if fault.hold:
            fault.arrived.set()
            fault.released.wait(120)
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{fault.code}</Code>'
            f"<Message>injected by the test</Message></Error>"
        ).encode()
        start_response(
            f"{fault.status} Injected", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
        )
        self._log.add(
            Request(
                environ.get("REQUEST_METHOD", ""),
                urllib.parse.unquote(environ.get("PATH_INFO", "")),
                environ.get("QUERY_STRING", ""),
                environ.get("HTTP_RANGE"),
                fault.status,
                len(body),
            )
        )
        return [body]

    def __call__(self, environ, start_response):
        status = []

        def capture(s, headers, exc_info=None):
            status.append(int(s.split(" ", 1)[0]))
            return start_response(s, headers, exc_info)

        method = environ.get("REQUEST_METHOD", "")
        if self.faults:
            fault = self._fault_for(method, urllib.parse.unquote(environ.get("PATH_INFO", "")))
            if fault is not None:
                return self._fail(fault, environ, start_response)
        lock = self._writes if method in _MUTATING else _NoLock
        with lock:
            result = self._app(environ, capture)
            try:
                body = list(result)  # run the handler to completion inside the lock
            finally:
                if hasattr(result, "close"):
                    result.close()
        self._log.add(
            Request(
                method,
                urllib.parse.unquote(environ.get("PATH_INFO", "")),
                environ.get("QUERY_STRING", ""),
                environ.get("HTTP_RANGE"),
                status[0] if status else 0,
                sum(len(b) for b in body),
            )
        )
        return body


class _NoLockType:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NoLock = _NoLockType()


class S3Server:
    """moto's S3 on 127.0.0.1:<free port>; .endpoint_url, .storage_options, .log, .reset()."""

    def __init__(self):
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class _Quiet(WSGIRequestHandler):
            def log(self, *args, **kwargs):  # one line per request would drown the test output
                pass

        self.log = RequestLog()
        app = _App(DomainDispatcherApplication(create_backend_app), self.log)
        self._app = app
        self._server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=_Quiet)
        host, port = self._server.server_address[:2]
        self.endpoint_url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-s3", daemon=True)

    @property
    def storage_options(self) -> dict:
        """fsspec/s3fs options that reach this server from any process (no reliance on env vars)."""
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": REGION},
        }

    def start(self) -> S3Server:
        self._thread.start()
        self.create_bucket(BUCKET)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        ).create_bucket(Bucket=name)

    def add_fault(self, method: str, path: str, **kwargs) -> Fault:
        """Fail matching requests from now on (see Fault); clear_faults() removes every fault."""
        fault = Fault(method, path, **kwargs)
        with self._app._fault_guard:
            self._app.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._app._fault_guard:
            for f in self._app.faults:
                f.release()
            self._app.faults.clear()

    def reset(self) -> None:
        """Drop every bucket and object (moto's reset API), then recreate the test bucket."""
        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=30).close()
        self.create_bucket(BUCKET)
