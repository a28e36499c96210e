"""OpenTelemetry traces of the request path, off unless ``SCACHE_TRACING__EXPORTER`` is set.

One trace per HTTP request (``AccessLog`` opens it, following a caller's ``traceparent``), with spans
``scache.lookup`` (attributes: the decision's request id, the nearest similarity, the decision, threshold,
arm: what RedisVL records on its lookups) and its children ``scache.embed``, ``scache.search``,
``scache.decide`` (``scache.judge`` inside it on a judged arm), then ``scache.upstream`` for a miss sent to
the model and ``scache.publish`` when the decision's event is handed to the publisher (off the request
path, in the event thread, still in the request's trace). A store is ``scache.store`` (items, stored)
with its ``scache.embed``.

Off (``none``, the default) every span site costs one attribute check: ``Tracing.span`` returns a shared
no-op and the SDK is never imported. The SDK comes with the ``otel`` extra; ``otlp`` also needs an OTLP
exporter package (not in the lock), and without it starting fails with a message saying which.
"""
from __future__ import annotations

import logging
from typing import Any

from cache_core.settings import TracingSettings

log = logging.getLogger(__name__)

OTLP_PACKAGES = ("opentelemetry-exporter-otlp-proto-http", "opentelemetry-exporter-otlp-proto-grpc")


class TracingError(RuntimeError):
    """The configured exporter cannot run here (a package is missing)."""


class _NoSpan:
    """What every span site gets while tracing is off."""

    def __enter__(self) -> "_NoSpan":
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def is_recording(self) -> bool:
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        pass


NO_SPAN = _NoSpan()


class Tracing:
    """Spans from an OpenTelemetry tracer, or nothing (``Tracing()``: off)."""

    def __init__(self, tracer=None, provider=None):
        self.enabled = tracer is not None
        self._tracer = tracer
        self._provider = provider

    def span(self, name: str, attributes: dict[str, Any] | None = None, parent=None, kind: str | None = None):
        """A context manager around one span (current while it runs); ``parent`` a context from
        ``capture()`` for work that continues in another thread."""
        if not self.enabled:
            return NO_SPAN
        kwargs = {"context": parent, "attributes": clean(attributes) if attributes else None}
        if kind is not None:  # "server" / "client"
            from opentelemetry.trace import SpanKind

            kwargs["kind"] = SpanKind[kind.upper()]
        return self._tracer.start_as_current_span(name, **kwargs)

    def capture(self):
        """The current context, to parent a span started later elsewhere (None while off)."""
        if not self.enabled:
            return None
        from opentelemetry import context

        return context.get_current()

    def extract(self, headers: dict[str, str]):
        """The caller's trace context from W3C ``traceparent`` headers (None while off or absent)."""
        if not self.enabled or "traceparent" not in headers:
            return None
        from opentelemetry.propagate import extract

        return extract(headers)

    def shutdown(self) -> None:
        """Export what is buffered and stop (the service's shutdown)."""
        if self._provider is not None:
            self._provider.shutdown()


OFF = Tracing()


def clean(attributes: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry refuses None values (with a warning per value): they are left out."""
    return {key: value for key, value in attributes.items() if value is not None}


def annotate(span, **attributes: Any) -> None:
    """Set ``scache.<name>`` attributes on a recording span, skipping None."""
    if span.is_recording():
        for key, value in attributes.items():
            if value is not None:
                span.set_attribute(f"scache.{key}", value)


def build_tracing(settings: TracingSettings, instance_id: str = "", exporter=None) -> Tracing:
    """The tracing the settings ask for; ``exporter`` (a span exporter, e.g. the SDK's in-memory one
    in tests) replaces the configured one and is flushed span by span."""
    if settings.exporter == "none" and exporter is None:
        return OFF
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise TracingError(f"SCACHE_TRACING__EXPORTER={settings.exporter} needs the OpenTelemetry SDK "
                           f"(pip install 'scache[otel]'): {exc}") from None
    resource = Resource.create({"service.name": settings.service_name,
                                **({"service.instance.id": instance_id} if instance_id else {})})
    provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(_exporter(settings)))
    log.info("tracing on", extra={"exporter": "given" if exporter is not None else settings.exporter,
                                  "sample_ratio": settings.sample_ratio})
    return Tracing(provider.get_tracer("scache"), provider)


def _exporter(settings: TracingSettings):
    if settings.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(service_name=settings.service_name)
    endpoint = {"endpoint": settings.otlp_endpoint} if settings.otlp_endpoint else {}
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TracingError("SCACHE_TRACING__EXPORTER=otlp needs an OTLP exporter, which is not installed: "
                               f"pip install {OTLP_PACKAGES[0]} (or {OTLP_PACKAGES[1]}); "
                               "or use SCACHE_TRACING__EXPORTER=console") from None
    return OTLPSpanExporter(**endpoint)
