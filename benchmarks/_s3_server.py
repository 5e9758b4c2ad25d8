"""moto's S3 app on 127.0.0.1:<free port>, in a thread, with a log of the requests it answered.

The benchmarks count what a call sent (requests, ranges, bytes received), so they need the log; Spark's
workers are other processes, so it is a server reached over HTTP, not an in-process mock. Object writes
are applied one at a time: moto checks If-None-Match and stores the object as two steps, and S3 decides a
conditional write atomically. (tests/helpers/s3_server.py is the tests' own, with injected faults.)
"""

from __future__ import annotations

import threading
import urllib.parse
from dataclasses import dataclass

BUCKET = "kafkalog-test"
ACCESS_KEY = "bench-access-key"
SECRET_KEY = "bench-secret-key"
REGION = "us-east-1"


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # /bucket/key, unquoted
    query: str
    range: str | None  # the Range header
    status: int
    body_bytes: int  # bytes in the response body


class RequestLog:
    """The requests answered, in order; mark() and since(mark) bracket what one call sent. Thread-safe."""

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
        return [r for r in items if path_prefix is None or r.path.startswith(path_prefix)]


class S3Server:
    """.endpoint_url, .storage_options (fsspec/s3fs options usable from any process), .log; start(), stop()."""

    def __init__(self):
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import WSGIRequestHandler, make_server

        class Quiet(WSGIRequestHandler):
            def log(self, *args, **kwargs):  # no line per request
                pass

        self.log = RequestLog()
        self._moto = DomainDispatcherApplication(create_backend_app)
        self._writes = threading.Lock()
        self._server = make_server("127.0.0.1", 0, self._serve, threaded=True, request_handler=Quiet)
        self.endpoint_url = f"http://127.0.0.1:{self._server.socket.getsockname()[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="bench-s3", daemon=True)

    def _serve(self, environ, start_response):
        status: list[int] = []

        def capture(s, headers, exc_info=None):
            status.append(int(s.split(" ", 1)[0]))
            return start_response(s, headers, exc_info)

        method = environ.get("REQUEST_METHOD", "")
        writes = method in ("PUT", "POST", "DELETE")
        if writes:
            self._writes.acquire()
        try:
            result = self._moto(environ, capture)
            try:
                body = list(result)
            finally:
                if hasattr(result, "close"):
                    result.close()
        finally:
            if writes:
                self._writes.release()
        path = urllib.parse.unquote(environ.get("PATH_INFO", ""))
        query, rng = environ.get("QUERY_STRING", ""), environ.get("HTTP_RANGE")
        self.log.add(Request(method, path, query, rng, status[0] if status else 0, sum(map(len, body))))
        return body

    @property
    def storage_options(self) -> dict:
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "endpoint_url": self.endpoint_url,
            "client_kwargs": {"region_name": REGION},
        }

    def start(self) -> S3Server:
        import boto3

        self._thread.start()
        boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        ).create_bucket(Bucket=BUCKET)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()
