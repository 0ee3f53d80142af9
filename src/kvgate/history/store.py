"""Where the history of main lives: an embedded SQLite file by default, PostgreSQL when KVGATE_HISTORY_URL names one.

One schema on both, created and upgraded by numbered migrations (table `history_migrations` records those applied);
a store written by a newer kvgate (a migration this one does not know) is refused. SQLite needs only the standard
library; PostgreSQL needs psycopg 3 (`pip install "psycopg[binary]"`), imported only when a server is named.
The URL is a secret (it may carry a password, in its userinfo or its query): kvgate never prints it, only the server
in words (`redacted`: "the PostgreSQL history user@host:port/db"), and an error message that quotes one of its
passwords has it replaced by ***.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import sqlite3
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from kvgate import InputError
from kvgate.history.record import HistoryRun, commit_url

URL_ENV = "KVGATE_HISTORY_URL"
DEFAULT_SQLITE = Path("reports") / "history.sqlite3"  # relative to the working directory
POSTGRES_SCHEMES = ("postgresql://", "postgres://")

# version -> statements; append, never edit one that has shipped. The SQL is the subset SQLite and PostgreSQL share.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE history_runs (
            id TEXT PRIMARY KEY, recorded_at TEXT NOT NULL, branch TEXT NOT NULL, git_commit TEXT,
            vllm_version TEXT, vllm_commit TEXT, passed INTEGER NOT NULL, neutral INTEGER NOT NULL,
            exit_status INTEGER NOT NULL, run_folder TEXT NOT NULL, environment TEXT NOT NULL)""",
        "CREATE INDEX history_runs_order ON history_runs (branch, recorded_at)",
        """CREATE TABLE history_figures (
            run_id TEXT NOT NULL REFERENCES history_runs (id), cell TEXT NOT NULL, measure TEXT NOT NULL,
            value DOUBLE PRECISION NOT NULL, low DOUBLE PRECISION, high DOUBLE PRECISION, n INTEGER,
            PRIMARY KEY (run_id, cell, measure))""",
        """CREATE TABLE history_acknowledged (
            cell TEXT NOT NULL, measure TEXT NOT NULL, git_commit TEXT NOT NULL, acknowledged_at TEXT NOT NULL,
            PRIMARY KEY (cell, measure, git_commit))""",
    ),
}
SCHEMA_VERSION = max(MIGRATIONS)


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    """One run's figure in a cell's series, in the order main recorded them."""

    recorded_at: str
    commit: str | None
    vllm_commit: str | None
    value: float
    low: float | None
    high: float | None
    commit_url: str | None = None  # the commit's page (kvgate.history.record.commit_url), where the run named its repository


class HistoryStore:
    """An open history: `record` a run, read `series`, `acknowledge` a change point. Use as a context manager."""

    def __init__(self, connection: Any, *, postgres: bool, shown: str):
        self._connection = connection
        self._postgres = postgres
        self.shown = shown

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self._connection.close()

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cursor = self._connection.cursor()
        cursor.execute(sql.replace("?", "%s") if self._postgres else sql, tuple(params))
        return cursor

    def migrate(self) -> int:
        """Apply the migrations this store lacks, in one transaction; returns the schema version."""
        try:
            tables = [] if self._postgres else sorted(row[0] for row in self._execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'").fetchall())
            if tables and "history_migrations" not in tables:  # a SQLite file is one program's: never add ours to it
                raise InputError(self.shown, f"is a SQLite database of another program (its tables: "
                                 f"{', '.join(map(str, tables))[:200]}), not a kvgate history",
                                 hint="Name the history's own file, e.g. reports/history.sqlite3")
            self._execute("CREATE TABLE IF NOT EXISTS history_migrations (version INTEGER PRIMARY KEY, "
                          "applied_at TEXT NOT NULL)")
            applied = {row[0] for row in self._execute("SELECT version FROM history_migrations").fetchall()}
            newer = sorted(v for v in applied if v not in MIGRATIONS)
            if newer:
                raise InputError(self.shown, f"history schema version {newer[-1]} is newer than this kvgate knows "
                                 f"({SCHEMA_VERSION})", hint="Upgrade kvgate")
            for version in sorted(set(MIGRATIONS) - applied):
                for statement in MIGRATIONS[version]:
                    self._execute(statement)
                self._execute("INSERT INTO history_migrations (version, applied_at) VALUES (?, ?)",
                              (version, _now()))
            self._connection.commit()
        except InputError:
            self._connection.rollback()
            raise
        except Exception as error:
            self._connection.rollback()
            locked = "locked" in _reason(error).lower()
            raise InputError(self.shown, f"cannot set up the history tables ({_reason(error)})",
                             hint="Another process holds it (a gate of main writing now?): try again when that ends"
                             if locked else "Is it a kvgate history store?") from None
        return SCHEMA_VERSION

    def record(self, run: HistoryRun) -> str:
        """Write one run and its figures in one transaction; returns the run's id. A run recorded again (the same
        branch, commit and CI run: a re-run of the gate job, or the gate judging one folder twice) replaces its
        earlier rows, so that no run counts twice in a series."""
        run_id = uuid.uuid4().hex
        for figure in run.figures:
            for name, number in (("value", figure.value), ("low", figure.low), ("high", figure.high)):
                if number is not None and (not _finite(number) or abs(number) > LARGEST):  # as `series` reads it
                    raise InputError(self.shown, f"cannot record the run: {figure.cell} {figure.measure} has the "
                                     f"{name} {number!r}, not a finite number of a measure")
        try:
            for old in self._same_run(run):
                self._execute("DELETE FROM history_figures WHERE run_id = ?", (old,))
                self._execute("DELETE FROM history_runs WHERE id = ?", (old,))
            self._execute(
                "INSERT INTO history_runs (id, recorded_at, branch, git_commit, vllm_version, vllm_commit, passed, "
                "neutral, exit_status, run_folder, environment) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, run.recorded_at, run.branch, run.commit, run.vllm_version, run.vllm_commit, int(run.passed),
                 int(run.neutral), run.exit_status, run.run_folder, json.dumps(run.environment, sort_keys=True)))
            for figure in run.figures:
                self._execute("INSERT INTO history_figures (run_id, cell, measure, value, low, high, n) "
                              "VALUES (?, ?, ?, ?, ?, ?, ?)",
                              (run_id, figure.cell, figure.measure, figure.value, figure.low, figure.high, figure.n))
            self._connection.commit()
        except Exception as error:
            self._connection.rollback()
            raise InputError(self.shown, f"cannot record the run ({_reason(error)})") from None
        return run_id

    def _same_run(self, run: HistoryRun) -> list[str]:
        """The ids of runs recorded before of the same branch, commit and CI run (run.json's workflow_run_id or
        build_url; outside CI, the same run folder finished at the same time)."""
        if not run.commit:
            return []
        rows = self._execute("SELECT id, run_folder, environment, recorded_at FROM history_runs WHERE branch = ? AND "
                             "git_commit = ?", (run.branch, run.commit)).fetchall()
        this = _ci_run(run.environment, run.run_folder, run.recorded_at)
        return [row[0] for row in rows if _ci_run(_environment(row[2]), row[1], row[3]) == this]

    def _read(self, what: str, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of a query; a store whose tables are not kvgate's (dropped, altered, unreadable) is bad input."""
        try:
            return self._execute(sql, params).fetchall()
        except Exception as error:
            self._connection.rollback()
            raise InputError(self.shown, f"cannot read {what} ({_reason(error)})",
                             hint="Is it a kvgate history store? Restore it from a copy, or move it away and let the "
                                  "next run of main start a new one") from None

    def series_names(self, branch: str) -> list[tuple[str, str]]:
        """(cell, measure) of every series the branch has, sorted."""
        rows = self._read("the series", "SELECT DISTINCT f.cell, f.measure FROM history_figures f JOIN history_runs r "
                          "ON r.id = f.run_id WHERE r.branch = ? ORDER BY f.cell, f.measure", (branch,))
        for row in rows:
            if not all(isinstance(name, str) for name in row):
                raise InputError(self.shown, f"a series of {branch} is named {row[0]!r} {row[1]!r}, not by text",
                                 hint="Correct or delete its rows in history_figures")
        return [(row[0], row[1]) for row in rows]

    def series(self, branch: str, cell: str, measure: str) -> list[Point]:
        """The series of a cell's measure; a row that is not a finite number (a hand-edited or damaged store) is bad
        input, named by its run id."""
        rows = self._read(
            f"the series {cell} {measure}",
            "SELECT r.recorded_at, r.git_commit, r.vllm_commit, f.value, f.low, f.high, r.environment, r.id FROM "
            "history_figures f JOIN history_runs r ON r.id = f.run_id WHERE r.branch = ? AND f.cell = ? AND "
            "f.measure = ? ORDER BY r.recorded_at, r.id", (branch, cell, measure))
        points = []
        for r in rows:
            problem = _row_problem(r)
            if problem is not None:
                raise InputError(self.shown, f"run {str(r[7])[:40]!r} of {branch}, {cell} {measure}: {problem}",
                                 hint="Correct or delete that run's rows (history_runs id, history_figures run_id)")
            points.append(Point(recorded_at=r[0], commit=r[1], vllm_commit=r[2], value=float(r[3]),
                                low=None if r[4] is None else float(r[4]), high=None if r[5] is None else float(r[5]),
                                commit_url=commit_url(_environment(r[6]).get("repository"), r[1])))
        return points

    def runs(self, branch: str) -> int:
        return self._read("the runs", "SELECT COUNT(*) FROM history_runs WHERE branch = ?", (branch,))[0][0]

    def acknowledge(self, cell: str, measure: str, commit: str) -> None:
        try:
            self._execute("INSERT INTO history_acknowledged (cell, measure, git_commit, acknowledged_at) "
                          "VALUES (?, ?, ?, ?)", (cell, measure, commit, _now()))
            self._connection.commit()
        except Exception as error:
            self._connection.rollback()
            raise InputError(self.shown, f"cannot acknowledge {cell} {measure} at {commit} ({_reason(error)})",
                             hint="Was it acknowledged already?") from None

    def acknowledged(self) -> set[tuple[str, str, str]]:
        rows = self._read("the acknowledged change points", "SELECT cell, measure, git_commit FROM history_acknowledged")
        return {(r[0], r[1], r[2]) for r in rows}


def location(db: str | Path | None = None) -> str:
    """Where the history is: --db, else KVGATE_HISTORY_URL, else the default SQLite file."""
    if db is not None:
        return str(db)
    return os.environ.get(URL_ENV) or str(DEFAULT_SQLITE)


# `scheme:/...`: a URL, never a file path (a SQLite file named `mysql:/host/db` would take the rows and lose them)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):/")
_KNOWN_FORMS = "postgresql://USER:PASSWORD@HOST:PORT/DATABASE, sqlite:///PATH or a SQLite file path"


def open_store(where: str, *, create: bool = True) -> HistoryStore:
    """Open (and migrate) the history at `where`: a postgresql:// URL, a sqlite:/// URL or a file path. Anything
    else that names a scheme (`mysql://`, `postgresql+psycopg://`, `https://`), white space around it, or SQLite's
    `:memory:` is refused: rows written there would be lost. A reader passes `create=False`: a SQLite file that does
    not exist (a typo, a dangling link) is refused, not created with the folders on its way."""
    scheme = _SCHEME.match(where)
    if where.startswith(POSTGRES_SCHEMES):
        store = _open_postgres(where)
    elif "password" in where.lower():  # a libpq key=value string: never a path to print
        raise InputError(URL_ENV, "holds a password but is no postgresql:// URL (not shown here)",
                         hint="Write postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or a SQLite file path")
    elif where != where.strip() or not where:
        raise InputError(URL_ENV, "the history's location is empty or starts or ends with white space (not shown here)",
                         hint=f"Write {_KNOWN_FORMS}")
    elif scheme is not None and not where.startswith("sqlite://"):  # a URL may carry a secret: only its scheme shown
        raise InputError(URL_ENV, f"names a history of scheme {scheme.group(1)[:20]!r}, which kvgate cannot keep a "
                         "history in (the rest not shown here)", hint=f"Write {_KNOWN_FORMS}")
    elif where.removeprefix("sqlite://").lstrip("/") == ":memory:" or where.startswith("file:"):
        raise InputError(where, "is no file: a history kept there is lost when kvgate exits",
                         hint="Name the history's SQLite file, e.g. reports/history.sqlite3")
    else:
        path = Path(where.removeprefix("sqlite://")) if where.startswith("sqlite://") else Path(where)
        if path.is_dir():
            raise InputError(str(path), "is a folder", hint="Name the history's SQLite file, e.g. reports/history.sqlite3")
        if not create and not path.exists():
            raise InputError(str(path), "holds no history: there is no such file", hint="The gate of main records its "
                             f"runs there (kvgate gate --history {path}); name the history with --db or {URL_ENV}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(path)
            connection.execute("PRAGMA foreign_keys = ON")
        except (OSError, sqlite3.Error) as error:
            raise InputError(str(path), f"cannot open the history ({_reason(error)})",
                             hint=f"Pass a writable file with --db or set {URL_ENV}") from None
        store = HistoryStore(connection, postgres=False, shown=str(path))
    store.migrate()
    return store


def _open_postgres(url: str) -> HistoryStore:
    shown = redacted(url)
    try:
        import psycopg
    except ImportError:
        raise InputError(URL_ENV, f"names a PostgreSQL server ({shown}), but psycopg 3 is not installed",
                         hint='Install it (`pip install "psycopg[binary]"`) or unset it to use the SQLite file') from None
    try:
        connection = psycopg.connect(url, connect_timeout=30)
    except psycopg.Error as error:
        raise InputError(shown, f"cannot connect ({_without_secrets(_reason(error), url)})",
                         hint=f"Check {URL_ENV} and that the server accepts this client") from None
    return HistoryStore(connection, postgres=True, shown=shown)


def redacted(url: str) -> str:
    """What kvgate prints for a PostgreSQL URL, never the URL itself: the server's user, host, port and database, as
    words; the userinfo's password and the whole query (`?password=`, `?sslpassword=`, any key) left out."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        user = unquote(netloc[0].split(":", 1)[0]) if len(netloc) == 2 else ""
        shown = f"the PostgreSQL history {quote(user, safe='') + '@' if user else ''}{netloc[-1]}{parts.path}"
    except ValueError:
        return f"the PostgreSQL history ({URL_ENV}: not a URL)"
    return shown + (" (its query not shown)" if parts.query else "")


def _without_secrets(text: str, url: str) -> str:
    """A message with every password the URL carries (its userinfo's, its query's) replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "a message about an unreadable URL"
    secrets = [value for key, value in parse_qsl(parts.query, keep_blank_values=True) if "pass" in key.lower()]
    userinfo = parts.netloc.rsplit("@", 1)[0] if "@" in parts.netloc else ""
    if ":" in userinfo:
        secrets.append(unquote(userinfo.split(":", 1)[1]))
        secrets.append(userinfo.split(":", 1)[1])
    for secret in sorted(filter(None, set(secrets)), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _reason(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _environment(environment: Any) -> dict[str, Any]:
    """A run's environment column as a mapping; {} for one that is not a JSON object."""
    try:
        value = json.loads(environment or "{}") if isinstance(environment, str) else None
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _ci_run(environment: Any, run_folder: Any, recorded_at: Any) -> tuple[str, ...]:
    """Which CI run a history run came from: its workflow run or build; outside CI, its run folder and its time."""
    environment = environment if isinstance(environment, dict) else {}
    for key in ("workflow_run_id", "build_url"):
        if isinstance(environment.get(key), str) and environment[key]:
            return key, environment[key]
    return "run_folder", str(run_folder), str(recorded_at)


# a figure past this (a damaged row) would overflow the plot's scale, or the squares of the t-test e-divisive runs (a
# series near 1e160 hid its change points); no measure kvgate records comes near it
LARGEST = 1e150


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _row_problem(row: Sequence[Any]) -> str | None:
    """What is wrong with a series row (recorded_at, commit, vLLM commit, value, low, high, ...); None when nothing."""
    if not isinstance(row[0], str):
        return f"its recorded_at is {str(row[0])[:40]!r}, not a time"
    for name, text in (("git_commit", row[1]), ("vllm_commit", row[2])):
        if text is not None and not isinstance(text, str):
            return f"its {name} is {str(text)[:40]!r}, not text"
    for name, number in (("value", row[3]), ("low", row[4]), ("high", row[5])):
        if number is None and name != "value":
            continue
        if not _finite(number) or abs(number) > LARGEST:
            return f"its {name} is {str(number)[:40]!r}, not a finite number of a measure"
    return None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
