"""The access log's direct path writes exactly what the logging call would have."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator

import pytest

from latgate.foundation.logs import (
    TEXT_FORMAT,
    TEXT_FORMAT_WITH_PID,
    AccessLog,
    JsonLineFormatter,
    TextLineFormatter,
)

MESSAGE = '{"request_id":"r1","status":200,"e2e_ms":1.5}'


@pytest.fixture
def root_handler() -> Iterator[logging.StreamHandler]:
    """The root logger's only handler, writing to a StringIO (logging state restored)."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    handler = logging.StreamHandler(io.StringIO())
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.handlers = saved_handlers
        root.setLevel(saved_level)


@pytest.mark.parametrize(
    "formatter",
    [TextLineFormatter(TEXT_FORMAT), TextLineFormatter(TEXT_FORMAT_WITH_PID), JsonLineFormatter()],
    ids=["text", "text_with_pid", "json"],
)
def test_a_direct_access_line_is_the_line_logging_writes(
    root_handler: logging.StreamHandler, formatter: logging.Formatter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "time", lambda: 1_764_400_000.0425)
    root_handler.setFormatter(formatter)
    access = AccessLog()
    access.logger.info(MESSAGE)  # through logging
    access.direct_to(root_handler)
    access.write(MESSAGE)  # direct
    through_logging, direct = root_handler.stream.getvalue().splitlines()
    assert direct == through_logging
    assert ",042 INFO latgate.access" in direct or '"ts":"2025-11-29T07:06:40.042+00:00"' in direct


def test_another_handler_sends_access_lines_back_through_logging(
    root_handler: logging.StreamHandler, caplog: pytest.LogCaptureFixture
) -> None:
    root_handler.setFormatter(TextLineFormatter(TEXT_FORMAT))
    access = AccessLog()
    access.direct_to(root_handler)
    with caplog.at_level(logging.INFO, logger="latgate.access"):  # adds pytest's handler
        access.write(MESSAGE)
    assert [record.getMessage() for record in caplog.records] == [MESSAGE]
    assert root_handler.stream.getvalue().endswith(MESSAGE + "\n")  # and the stream still has it
