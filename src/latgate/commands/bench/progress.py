"""Progress of a bench run on stderr: a rich bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
from typing import Self, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from latgate.commands.bench.sample import RequestSample


class BenchProgress:
    """Counts finished requests and shows them; use as a context manager.

    Parameters:
        total: the number of requests in the run.
        stream: where to draw (stderr by default). On a terminal a live bar is drawn;
            elsewhere (CI logs, pipes) a plain line is written at every tenth of the run.

    ``update(sample)`` is the ``on_sample`` callback of ``run_bench``.
    """

    def __init__(self, *, total: int, stream: TextIO | None = None) -> None:
        self._total = total
        self._stream = stream if stream is not None else sys.stderr
        self._done = 0
        self._errors = 0
        self._step = max(1, total // 10)
        self._progress: Progress | None = None
        self._task_id: TaskID | None = None  # set with _progress
        if self._stream.isatty():
            self._progress = Progress(
                TextColumn("bench"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[errors]} errors"),
                TimeElapsedColumn(),
                console=Console(file=self._stream),
                transient=True,
            )
            self._task_id = self._progress.add_task("bench", total=total, errors=0)

    def __enter__(self) -> Self:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, sample: RequestSample) -> None:
        self._done += 1
        self._errors += 0 if sample.ok else 1
        if self._progress is not None and self._task_id is not None:
            self._progress.update(self._task_id, completed=self._done, errors=self._errors)
        elif self._done % self._step == 0 or self._done == self._total:
            self._stream.write(f"bench: {self._done}/{self._total} requests done, {self._errors} errors\n")
            self._stream.flush()
