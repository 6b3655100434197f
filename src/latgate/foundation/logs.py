"""Log output of the gateway process: plain text lines, or one JSON object per line.

``--log-format text`` (the default) prints ``TIME LEVEL LOGGER MESSAGE``; the access log's
message is already a JSON object (see :mod:`latgate.forwarding.exchange`).

``--log-format json`` prints every record as one JSON object, for log shippers (Loki,
Fluent Bit, CloudWatch): ``{"ts", "level", "logger", "pid", "message"}``, and for the
access log ``{"ts", "level", "logger", "pid", "request_id", "provider", ...}``: the access fields are
spliced in at the top level instead of being nested as a string. Tracebacks are never
printed; an exception becomes its type name in ``"error"``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from datetime import UTC, datetime
from typing import TextIO

import orjson

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
TEXT_FORMAT_WITH_PID = "%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"
ACCESS_LOGGER = "latgate.access"


class TextLineFormatter(logging.Formatter):
    """``logging.Formatter`` whose time stamp (``2026-01-31 12:00:00,123``, local time)
    is formatted once per second rather than once per record: ``localtime`` and
    ``strftime`` were most of an access line's formatting cost."""

    def __init__(self, fmt: str) -> None:
        super().__init__(fmt)
        self._second = -1
        self._stamp = ""
        self._show_pid = fmt == TEXT_FORMAT_WITH_PID

    def access_line(self, created: float, message: str) -> str:
        """What :meth:`format` makes of an INFO record of the access logger carrying
        ``message``, created at ``created`` (``time.time()``), without the record."""
        second = int(created)
        if second != self._second:
            self._stamp = time.strftime(self.default_time_format, self.converter(second))
            self._second = second
        name = f"{ACCESS_LOGGER}[{os.getpid()}]" if self._show_pid else ACCESS_LOGGER
        return f"{self._stamp},{int((created - second) * 1000):03d} INFO {name} {message}"

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime(self.default_time_format, self.converter(second))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for its fields)."""

    def access_line(self, created: float, message: str) -> str:
        """What :meth:`format` makes of an INFO record of the access logger carrying
        ``message`` (a JSON object), created at ``created``, without the record."""
        head = {
            "ts": datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": "info",
            "logger": ACCESS_LOGGER,
            "pid": os.getpid(),
        }
        return orjson.dumps(head).decode()[:-1] + "," + message[1:]

    def format(self, record: logging.LogRecord) -> str:
        head = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
        }
        message = record.getMessage()
        if (
            record.name == ACCESS_LOGGER
            and message.startswith("{")
            and message.endswith("}")
            and len(message) > 2
        ):
            # The access line is a JSON object already: splice, don't re-encode.
            return orjson.dumps(head).decode()[:-1] + "," + message[1:]
        head["message"] = message
        if record.exc_info and record.exc_info[0] is not None:
            head["error"] = record.exc_info[0].__name__
        return orjson.dumps(head).decode()


def configure_logging(*, level: str, log_format: str = "text", show_pid: bool = False) -> None:
    """Send latgate's and uvicorn's records to stderr at ``level`` in ``log_format``.

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error``.
        log_format: ``text`` or ``json`` (:data:`LOG_FORMATS`).
        show_pid: put the process id in text lines too (worker processes); JSON lines
            always carry it.

    Like :func:`logging.basicConfig`, this does nothing to a root logger that has
    handlers already (pytest's capture, an embedding application). httpx's per-request
    lines (full upstream URLs) stay out either way.
    """
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            JsonLineFormatter() if log_format == "json" else TextLineFormatter(TEXT_FORMAT_WITH_PID if show_pid else TEXT_FORMAT)
        )
        root.addHandler(handler)
        root.setLevel(level.upper())
        access_log.direct_to(handler)
        # The process's logging is ours: skip the record fields no format here prints
        # (the caller's file and line, found by walking the stack; thread and
        # multiprocessing names), which were a third of each access line's cost.
        logging._srcfile = None  # the documented switch (logging HOWTO, "Optimization")
        logging.logThreads = False
        logging.logMultiprocessing = False
    # httpx logs every request with its full URL at INFO: internal addresses stay out of logs.
    logging.getLogger("httpx").setLevel(logging.WARNING)


class AccessLog:
    """The access log: one INFO line per request on the ``latgate.access`` logger.

    Where :func:`configure_logging` installed the process's only handler and nothing
    else was added since (no handler or filter on the access logger, the root's
    handler still the only one), a line is formatted by that handler's formatter and
    written to its stream directly, exactly as the logging call would have, without a
    ``LogRecord`` and the logger/handler call chain (its cost: docs/performance.md,
    "Why the hot path is written as it is"). Anywhere else (pytest's
    capture, an embedding application's logging set-up) it is an ordinary
    ``logger.info`` call.
    """

    def __init__(self) -> None:
        self.logger = logging.getLogger(ACCESS_LOGGER)
        self._handler: logging.StreamHandler[TextIO] | None = None

    def direct_to(self, handler: logging.StreamHandler[TextIO]) -> None:
        """Write lines straight to ``handler`` (the one :func:`configure_logging` made)."""
        self._handler = handler

    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)

    def write(self, message: str) -> None:
        """Log ``message`` (one JSON object) at INFO."""
        handler = self._handler
        root_handlers = logging.root.handlers
        logger = self.logger
        if (
            handler is None
            or len(root_handlers) != 1
            or root_handlers[0] is not handler
            or logger.handlers
            or logger.filters
            or handler.filters
            or logging.root.filters
            or not isinstance(handler.formatter, TextLineFormatter | JsonLineFormatter)
        ):
            logger.info(message)
            return
        line = handler.formatter.access_line(time.time(), message)
        try:
            # Handler.__init__ always makes the lock (typeshed has it Optional for
            # createLock overrides); a None check here would be per access line
            with handler.lock:  # type: ignore[union-attr]
                stream = handler.stream
                stream.write(line + "\n")
                stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: logging's own handling
            logger.info(message)


#: The process's access log (logging's loggers are process-wide too).
access_log = AccessLog()
