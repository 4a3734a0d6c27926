"""OpenTelemetry: one server span per request, with the check verdicts, when it is wanted.

Tracing is on when ``opentelemetry`` is importable (the ``otel`` extra) and at least one
standard ``OTEL_*`` variable is set (and ``OTEL_SDK_DISABLED`` is not ``true``), or when a
tracer provider is passed in explicitly (tests). Without it, :func:`make_tracing` returns
``None`` and the request path does no tracing work at all.

If the SDK is installed and no SDK provider is configured yet, one is set up from the standard
variables: ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` for the resource and
``OTEL_TRACES_EXPORTER`` (``otlp`` by default, ``console``, ``none``) for the exporter, with a
batch processor. An incoming ``traceparent`` is honoured and the span's context is propagated to
the upstream.

Span attributes: ``http.request.method``, ``url.path`` (known routes only), ``http.route``,
``http.response.status_code``, ``schedguard.request_id``, ``schedguard.tenant``,
``schedguard.verdict`` (``allowed`` / ``rejected``), ``schedguard.code``, one
``schedguard.check.<name>`` per check run (``pass`` or its code) and token counts. No request
content is recorded.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

__all__ = ["RequestSpan", "Tracing", "make_tracing", "otel_requested"]

_log = logging.getLogger(__name__)
_configured_sdk = False


def otel_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for tracing (any ``OTEL_*`` variable, SDK not disabled)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(name.startswith("OTEL_") for name in env)


class RequestSpan:
    """The span of one request; attributes are set as the request goes."""

    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, key: str, value: str | int | float | bool) -> None:
        self._span.set_attribute(key, value)

    def set_many(self, attributes: Mapping[str, str | int | float | bool]) -> None:
        self._span.set_attributes(dict(attributes))

    def checks(self, verdicts: Iterable[tuple[str, str]]) -> None:
        """``(check name, "pass" or its code)`` for each check that ran."""
        for name, outcome in verdicts:
            self._span.set_attribute(f"schedguard.check.{name}", outcome)

    def inject(self, carrier: MutableMapping[str, str]) -> None:
        """Add this span's ``traceparent`` (and friends) to the upstream's headers."""
        from opentelemetry import propagate, trace

        propagate.inject(carrier, context=trace.set_span_in_context(self._span))

    def end(self, status: int, code: str | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self._span
        span.set_attribute("http.response.status_code", status)
        if code is not None:
            span.set_attribute("schedguard.code", code)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, code or str(status)))
        span.end()


class Tracing:
    """Starts request spans on one tracer."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer

    def start(self, method: str, route: str, headers: Iterable[tuple[bytes, bytes]]) -> RequestSpan:
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind

        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in headers
            if name in (b"traceparent", b"tracestate", b"baggage")
        }
        parent = propagate.extract(carrier) if carrier else None
        span = self._tracer.start_span(
            f"{method} {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "http.route": route},
        )
        return RequestSpan(span)


def make_tracing(provider: Any = None, env: Mapping[str, str] | None = None) -> Tracing | None:
    """A :class:`Tracing` on ``provider``, or on the global provider when the environment asks
    for it; ``None`` when tracing is off or opentelemetry is not installed."""
    if provider is None and not otel_requested(env):
        return None
    try:
        from opentelemetry import trace
    except ImportError:
        _log.warning(
            "OTEL_* is set but opentelemetry is not installed: pip install schedguard[otel]"
        )
        return None
    if provider is None:
        _configure_sdk(os.environ if env is None else env)
        return Tracing(trace.get_tracer("schedguard.guard"))
    return Tracing(provider.get_tracer("schedguard.guard"))


def _configure_sdk(env: Mapping[str, str]) -> None:
    """Install an SDK provider from the standard variables unless one is installed already."""
    global _configured_sdk
    if _configured_sdk:
        return
    _configured_sdk = True
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        return  # API only: spans are no-ops unless the host installed a provider
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    provider = TracerProvider(resource=Resource.create())
    exporter: SpanExporter | None = None
    kind = env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")[0].strip().lower()
    if kind == "console":
        exporter = ConsoleSpanExporter()
    elif kind == "otlp":
        exporter = _otlp_exporter(env)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def _otlp_exporter(env: Mapping[str, str]) -> Any:
    protocol = env.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    )
    transport = "http" if protocol.startswith("http") else "grpc"
    try:
        module = importlib.import_module(
            f"opentelemetry.exporter.otlp.proto.{transport}.trace_exporter"
        )
    except ImportError:
        _log.warning("no OTLP exporter installed (pip install schedguard[otel]); spans dropped")
        return None
    return module.OTLPSpanExporter()
