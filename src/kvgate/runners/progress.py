"""Progress lines (one as each stage of a cell starts and ends), the summary table, GitHub Actions log groups, and
the heartbeat of a long stage (the questions lm-eval has answered, read from its output). No I/O of its own: the
heartbeat is given its clock and its printer."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence

from kvgate.runners.outcome import StageOutcome


def start_line(index: int, total: int, cell_id: str, stage: str) -> str:
    return f"kvgate: [{index}/{total}] {cell_id} {stage} started"


def end_line(index: int, total: int, outcome: StageOutcome) -> str:
    text = f"kvgate: [{index}/{total}] {outcome.cell_id} {outcome.stage} {outcome.status.upper()} " \
           f"in {format_seconds(outcome.elapsed)}"
    detail = outcome.headline if outcome.ok else (outcome.reason or "")
    return f"{text}: {detail}" if detail else text


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def summary_table(outcomes: Sequence[StageOutcome], max_detail: int = 110) -> str:
    rows = [("cell", "stage", "status", "elapsed", "result")]
    for outcome in outcomes:
        detail = outcome.headline if outcome.ok else (outcome.reason or "")
        if len(detail) > max_detail:
            detail = detail[: max_detail - 3] + "..."
        rows.append((outcome.cell_id, outcome.stage, outcome.status, format_seconds(outcome.elapsed), detail))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4])
        if n == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * max(6, min(max_detail, max(len(r[4]) for r in rows))))
    ok = sum(1 for o in outcomes if o.ok)
    failed = sum(1 for o in outcomes if o.failed)
    skipped = len(outcomes) - ok - failed
    lines.append(f"{len(outcomes)} stage runs, {ok} ok, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return "\n".join(line.rstrip() for line in lines)


# ------------------------------------------------------------------------------------ GitHub Actions log groups

def group_start(title: str) -> str:
    """GitHub Actions folds what follows, up to GROUP_END, under `title` (its `::group::` workflow command). The
    titles kvgate writes are its own progress lines: cell ids, stage names and counts, nothing to escape."""
    return f"::group::{title}"


GROUP_END = "::endgroup::"


# ---------------------------------------------------------------------------------------- the heartbeat

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# a whole count: tqdm writes " [elapsed<remaining" after it, so a redraw cut inside the count never matches
_GENERATE = re.compile(r"Running generate_until requests:\s*\d+%\|[^|]*\|\s*(\d+)/(\d+) \[")
_PROMPTS = re.compile(r"Processed prompts:\s*\d+%\|[^|]*\|\s*(\d+)/(\d+) \[")


class AnsweredQuestions:
    """Questions lm-eval has answered, read from the output of its `vllm` model as it streams by.

    lm-eval draws a `Running generate_until requests: n/m` bar around each evaluation (one per look of a candidate
    cell), which stands at 0 until vLLM returns every answer at once; inside it vLLM draws `Processed prompts: n/m`
    bars as answers come back (one per batch it is handed). So the questions answered are those of the evaluations
    finished, plus the finished and running prompt bars of the running one. A prompt bar outside an evaluation
    (kvgate's probe, after lm-eval) is not a question; tqdm's repeated closing draw of a bar counts once."""

    def __init__(self) -> None:
        self._pending = ""
        self.finished = 0  # questions of finished evaluations
        self.evaluation_size: int | None = None  # questions of the running evaluation, None between evaluations
        self._batches_done = 0  # questions of its finished prompt bars
        self._batch_done: int | None = None  # the running prompt bar's count, None when no bar is open

    @property
    def started(self) -> bool:
        """An evaluation has begun (the engine is up and answering)."""
        return self.finished > 0 or self.evaluation_size is not None

    @property
    def answered(self) -> int:
        if self.evaluation_size is None:
            return self.finished
        running = self._batches_done + (self._batch_done or 0)
        return self.finished + min(running, self.evaluation_size)

    @property
    def seen_total(self) -> int:
        """The questions of the evaluations begun so far."""
        return self.finished + (self.evaluation_size or 0)

    def feed(self, text: str) -> None:
        """More of the stream; a bar's redraw may arrive cut anywhere."""
        segments = re.split(r"[\r\n]", self._pending + text)
        self._pending = segments.pop()
        for segment in segments:
            self._read(_ANSI.sub("", segment))
        # tqdm ends a redraw only with the next one's carriage return: the newest redraw is the unended rest. Reading
        # it now and again once it ends changes nothing (a count is set, a bar's end counts once).
        self._read(_ANSI.sub("", self._pending))

    def _read(self, segment: str) -> None:
        if match := _GENERATE.search(segment):
            done, size = int(match[1]), int(match[2])
            if done < size and self.evaluation_size is None:
                self.evaluation_size, self._batches_done, self._batch_done = size, 0, None
            elif done >= size and self.evaluation_size is not None:
                self.finished += self.evaluation_size
                self.evaluation_size, self._batches_done, self._batch_done = None, 0, None
        elif (match := _PROMPTS.search(segment)) and self.evaluation_size is not None:
            done, size = int(match[1]), int(match[2])
            if done < size:
                self._batch_done = done
            elif self._batch_done is not None:  # the bar's first closing draw
                self._batches_done += size
                self._batch_done = None


class Heartbeat:
    """A line every `every` seconds while a long stage runs, so that a log shows it is alive and how far it got:
    `kvgate: <what>: 412/1319 questions, 3 min 10 s elapsed, ETA 6 min 50 s` when it counts questions (the ETA from
    the pace since answering began), else `kvgate: <what>: 3 min 10 s elapsed`. `feed` takes the tool's output
    (from the thread that reads it); `beat` says a line when one is due. The clock and the printer are given, so it
    does no I/O of its own."""

    def __init__(self, what: str, *, every: float = 60.0, questions: int | None = None, count_questions: bool = False,
                 clock: Callable[[], float], say: Callable[[str], None]) -> None:
        self.what, self.every, self.questions, self.clock, self.say = what, every, questions, clock, say
        self.counter = AnsweredQuestions() if count_questions else None
        self.started_at = clock()
        self._last_said = self.started_at
        self._answering_since: float | None = None
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        if self.counter is None:
            return
        with self._lock:
            self.counter.feed(data.decode("utf-8", "replace"))
            if self._answering_since is None and self.counter.started:
                self._answering_since = self.clock()

    def beat(self) -> None:
        now = self.clock()
        if now - self._last_said >= self.every:
            self._last_said = now
            self.say(self.line(now))

    def line(self, now: float) -> str:
        elapsed = f"{format_seconds(now - self.started_at)} elapsed"
        if self.counter is None:
            return f"kvgate: {self.what}: {elapsed}"
        with self._lock:
            answered, seen, since = self.counter.answered, self.counter.seen_total, self._answering_since
        if since is None:
            return f"kvgate: {self.what}: no question answered yet (the engine is starting), {elapsed}"
        total = max(self.questions or 0, seen)
        text = f"kvgate: {self.what}: {answered}/{total} questions, {elapsed}"
        if 0 < answered < total and now > since:
            text += f", ETA {format_seconds((now - since) / answered * (total - answered))}"
        return text
