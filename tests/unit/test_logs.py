"""accord.logs: JSON lines that parse, carry trace ids inside a span and identifiers from
``extra``, never content keys or exception messages; ready records also reach stdout."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from accord import logs

MARKER = "PAYLOAD-MARKER-91c2"


@pytest.fixture
def streams() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    err, out = io.StringIO(), io.StringIO()
    try:
        yield err, out
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)
        root.setLevel(level)


def test_json_lines_parse_and_carry_identifiers(streams: tuple[io.StringIO, io.StringIO]) -> None:
    err, out = streams
    logs.configure("json", "INFO", stderr=err, stdout=out)
    log = logging.getLogger("accord.test")
    log.info("settled job=%s", 7, extra={"tenant": "acme", "job_id": 7, "payload": MARKER})
    log.debug("not at INFO")
    [line] = err.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "INFO" and record["logger"] == "accord.test"
    assert record["message"] == "settled job=7" and record["time"].endswith("+00:00")
    assert record["tenant"] == "acme" and record["job_id"] == 7
    assert "trace_id" not in record  # outside a span: no ids
    assert MARKER not in line and "payload" not in record  # a content key never written
    assert out.getvalue() == ""  # not a ready record: stderr only


def test_trace_ids_inside_a_span(streams: tuple[io.StringIO, io.StringIO]) -> None:
    err, out = streams
    logs.configure("json", "INFO", stderr=err, stdout=out)
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("process") as span:
        logging.getLogger("accord.test").info("inside")
    record = json.loads(err.getvalue())
    context = span.get_span_context()
    assert record["trace_id"] == format(context.trace_id, "032x")
    assert record["span_id"] == format(context.span_id, "016x")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_an_exception_is_its_type_and_frames_never_its_message(
    fmt: str, streams: tuple[io.StringIO, io.StringIO]
) -> None:
    err, out = streams
    logs.configure(fmt, "INFO", stderr=err, stdout=out)
    try:
        raise ValueError(f"bad input {MARKER}")
    except ValueError:
        logging.getLogger("accord.test").exception("handler failed")
    text = err.getvalue()
    assert "handler failed" in text and "ValueError" in text and "test_logs.py" in text
    assert MARKER not in text


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_ready_records_reach_stdout_too(fmt: str, streams: tuple[io.StringIO, io.StringIO]) -> None:
    err, out = streams
    logs.configure(fmt, "INFO", stderr=err, stdout=out)
    log = logging.getLogger("accord.worker")
    log.info("working")  # control: an ordinary record stays on stderr
    log.info("worker ready: workflow=%s", "report", extra=logs.READY)
    log.info("relay ready: exchange=%s", "x")  # the older lines, without the marker
    assert "worker ready: workflow=report" in out.getvalue()
    assert "relay ready: exchange=x" in out.getvalue()
    assert "working" not in out.getvalue() and "working" in err.getvalue()
    if fmt == "json":
        assert [json.loads(x)["event"] for x in out.getvalue().splitlines()[:1]] == ["ready"]
    else:
        assert "event=ready" in out.getvalue()


def test_text_format_appends_identifiers(streams: tuple[io.StringIO, io.StringIO]) -> None:
    err, out = streams
    logs.configure("text", "INFO", stderr=err, stdout=out)
    logging.getLogger("accord.test").warning("poison", extra={"reason": "schema", "body": MARKER})
    line = err.getvalue().strip()
    assert " WARNING accord.test poison reason=schema" in line and MARKER not in line
    # a second configure replaces the first's handlers (no doubled lines)
    logs.configure("text", "INFO", stderr=err, stdout=out)
    logging.getLogger("accord.test").warning("once")
    assert err.getvalue().count("once") == 1
