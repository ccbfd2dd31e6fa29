"""A small OTLP/HTTP trace receiver: what a collector does with `POST /v1/traces`, decoding the
exporter's protobuf (`opentelemetry-proto`) into plain spans. For the tests (one trace per run,
as a backend receives it) and the tracing bench (the exporter's real cost, to a local receiver).

    with OtlpReceiver() as receiver:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        ...
        receiver.spans  # every span received so far
"""

from __future__ import annotations

import gzip
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
MAX_BODY_BYTES = 64 * 1024 * 1024
KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_ERROR = 2


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived: ids as hex, attributes as Python values."""

    name: str
    kind: str  # INTERNAL | SERVER | CLIENT | PRODUCER | CONSUMER
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]  # (trace id, span id)
    error: bool
    service: str | None = None
    start_ns: int = 0
    end_ns: int = 0


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ExportTraceServiceRequest."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        kind=KINDS.get(span.kind, "UNSPECIFIED"),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex() or None,
                        attributes=_attributes(span.attributes),
                        events=[(e.name, _attributes(e.attributes)) for e in span.events],
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        error=span.status.code == STATUS_ERROR,
                        service=resource.get("service.name"),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


@dataclass
class _Store:
    keep: bool
    lock: threading.Lock = field(default_factory=threading.Lock)
    spans: list[ReceivedSpan] = field(default_factory=list)
    count: int = 0
    requests: int = 0


class _Handler(BaseHTTPRequestHandler):
    store: _Store

    def do_POST(self) -> None:
        if self.path != TRACES_PATH:
            self.send_error(404)
            return
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY_BYTES:
            self.send_error(413)
            return
        body = self.rfile.read(length)
        encoding = (self.headers.get("content-encoding") or "").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        spans = decode(body)
        with self.store.lock:
            self.store.requests += 1
            self.store.count += len(spans)
            if self.store.keep:
                self.store.spans.extend(spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", PROTOBUF)
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: the tests' and the bench's output is theirs


class OtlpReceiver:
    """`POST /v1/traces` on 127.0.0.1:<free port>, in a thread. `keep=False` only counts (the
    bench: decoding stays, the list does not grow)."""

    def __init__(self, *, keep: bool = True) -> None:
        self._store = _Store(keep=keep)
        handler = type("Handler", (_Handler,), {"store": self._store})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-receiver", daemon=True
        )

    @property
    def endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT (the exporter appends /v1/traces)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._store.lock:
            return list(self._store.spans)

    @property
    def count(self) -> int:
        with self._store.lock:
            return self._store.count

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
