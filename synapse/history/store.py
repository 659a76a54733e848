"""The history store: finished jobs and their runs in SQLite or PostgreSQL, through SQLAlchemy Core.

    history: {url: sqlite:////var/lib/synapse/history.sqlite}       # the embedded default
    history: {url: postgresql+psycopg://synapse@db/synapse}         # masters on several machines

The tables, their migrations and the rows a record becomes are synapse.history.schema's. `export`
writes a batch and moves the cursor in one transaction, and only from the cursor it was computed
against: rows are upserted on their natural keys and a run's usage is added only when its row is
new, so a batch written twice changes nothing, and a batch that fails moves nothing. `migrate` runs
the schema's migrations; PostgreSQL serialises concurrent migrations with an advisory lock.
"""

from __future__ import annotations

import logging
import operator
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.sql.compiler import SQLCompiler

from synapse.core.history import (
    UTILIZATION_MAX_GAP_S,
    ClusterSample,
    JobRecord,
    day_of,
    utilization_rows,
)
from synapse.history.schema import (
    CLUSTER_COLUMNS,
    GOODPUT_COLUMNS,
    MIGRATIONS,
    SCHEMA_VERSION,
    cluster_daily,
    cluster_sampled,
    cursor_table,
    job_row,
    jobs,
    run_row,
    runs,
    schema_table,
    usage_daily,
    usage_rows,
)

if TYPE_CHECKING:  # each dialect's insert is imported where a store of that dialect makes one
    from sqlalchemy.dialects import postgresql, sqlite

_T = TypeVar("_T")

log = logging.getLogger(__name__)

#: Drivers the store supports: SQLite (the standard library's) and PostgreSQL through psycopg 3.
DRIVERS = {"sqlite": "sqlite", "sqlite+pysqlite": "sqlite", "postgresql": "postgresql+psycopg",
           "postgresql+psycopg": "postgresql+psycopg"}
#: Rows a history query returns at most per page.
MAX_PAGE = 5000
#: Advisory lock key of the schema migrations on PostgreSQL.
_MIGRATION_LOCK = 0x5359_4E48



class StoreError(RuntimeError):
    """The store cannot be used now (unreachable, refused, not migrated); the message says why."""


#: Which of a batch's jobs and runs the store holds already (one expanding parameter: the ids are
#: not each made a literal of the statement).
_KNOWN_JOBS = sa.select(jobs.c.job_id).where(jobs.c.job_id.in_(sa.bindparam("ids", expanding=True)))
_KNOWN_RUNS = sa.select(runs.c.job_id, runs.c.attempt).where(runs.c.job_id.in_(sa.bindparam("ids", expanding=True)))


#: Rows per statement of the export's upserts on SQLite, largest first: a batch of n rows goes as
#: n's binary parts (120 = 64 + 32 + 16 + 8), each one multi-row statement. 128 rows of
#: history_jobs bind 4,480 values: only sizes within `SQLITE_MAX_PARAMS` are used.
ROWS_PER_STATEMENT = (128, 64, 32, 16, 8, 4, 2, 1)
#: The values one SQLite statement may bind: 32,766 since SQLite 3.32, 999 before (the library
#: Python's sqlite3 was built against: an older distribution's is older).
SQLITE_MAX_PARAMS = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999


class _Upsert:
    """One of the export's writes, compiled once for a dialect, run with its rows as the driver
    takes them.

    SQLAlchemy's `conn.execute(statement, rows)` looks the statement up in its compiled cache (a
    cache key over every column of the upsert) and converts each row to the driver's parameters in
    Python: most of an exported job's CPU on the leader. Here that happens once, and a row goes
    to the driver as a tuple (SQLite) or as the dict itself (psycopg).

    SQLite's executemany runs a row at a time and lets go of Python's lock around each. Alone
    that is cheap; on a loaded leader, whose event loop and Raft thread take the lock at once,
    each let-go cost far more than the row (120 jobs a batch, one row a statement: ~17 µs of thread
    CPU per job alone, ~95 beside one busy thread; `bench/lock_handoff.py`). So on SQLite a
    statement carries up to 128 rows
    (`ROWS_PER_STATEMENT`, fewer where the SQLite library binds fewer values): the one-row SQL
    with its VALUES group repeated, checked to hold every parameter. psycopg's executemany
    pipelines the rows already, and the same multi-row statements cost it four times the CPU (it
    adapts each of their thousands of parameters): PostgreSQL keeps executemany. Only for
    statements whose parameters are plain values (no type processors: the history tables' columns
    are numbers and text)."""

    def __init__(self, statement: sa.ClauseElement, columns: tuple[str, ...], dialect: sa.Dialect,
                 max_params: int) -> None:
        compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
        self.sql, self.positional = str(compiled), bool(compiled.positional)
        #: the rows a statement may carry, largest first (1 always: a row is one statement's worth)
        self.sizes = tuple(n for n in ROWS_PER_STATEMENT if n == 1 or n * len(columns) <= max_params)
        self.values = operator.itemgetter(*columns)
        if self.positional and tuple(compiled.positiontup or ()) != columns:
            raise RuntimeError(f"the upsert's parameters are not the table's columns in order: {self.sql}")
        group = f"VALUES ({', '.join('?' * len(columns))})"
        #: the VALUES group to repeat for several rows ('' : one row a statement)
        self._group = group if self.positional and self.sql.count(group) == 1 \
            and self.sql.count("?") == len(columns) else ""
        self._multi: dict[int, str] = {}

    def _sql_for(self, n: int) -> str:
        if n not in self._multi:
            self._multi[n] = self.sql.replace(self._group, "VALUES " + ", ".join([self._group[7:]] * n), 1)
        return self._multi[n]

    def run(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        if not self._group:
            conn.exec_driver_sql(self.sql, [self.values(row) for row in rows] if self.positional else rows)
            return
        done = 0
        for size in self.sizes:
            while len(rows) - done >= size:
                conn.exec_driver_sql(self._sql_for(size),
                                     tuple(v for row in rows[done:done + size] for v in self.values(row)))
                done += size


@dataclass(frozen=True, slots=True)
class _Upserts:
    jobs: _Upsert
    runs: _Upsert
    usage: _Upsert


class CursorMoved(StoreError):
    """Another exporter moved the cursor since this batch was computed; nothing was written."""


def check_url(url: str) -> str:
    """The URL with its driver made explicit, or ValueError naming what is wrong (no connection)."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"not a database URL ({exc})") from None
    driver = DRIVERS.get(parsed.drivername)
    if driver is None:
        raise ValueError(f"unsupported database {parsed.drivername!r} (use sqlite:///PATH or "
                         "postgresql+psycopg://USER@HOST/DB)")
    if driver == "sqlite" and not parsed.database:
        raise ValueError("a SQLite URL needs a file: sqlite:////absolute/path/history.sqlite")
    if driver.startswith("postgresql") and not parsed.database:
        raise ValueError("a PostgreSQL URL needs a database name: postgresql+psycopg://USER@HOST/DB")
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def redacted(url: str) -> str:
    """The URL without its password, for logs and messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "(malformed URL)"


@dataclass(frozen=True, slots=True)
class JobQuery:
    """A history query: every filter optional; times are seconds since the epoch."""

    user: str = ""
    queue: str = ""
    state: str = ""
    job_id: str = ""
    since: float = 0.0  #: jobs that ended at or after this
    until: float = 0.0  #: and before this (0: no bound)
    limit: int = 1000
    after_end: float = 0.0  #: paging: after this (end, job id)
    after_id: str = ""


class HistoryStore:
    """One database's history tables. Blocking: the master calls it from a worker thread."""

    def __init__(self, url: str, connect_timeout: float = 3.0) -> None:
        self.url = check_url(url)
        self.dialect = "postgresql" if self.url.startswith("postgresql") else "sqlite"
        if self.dialect == "sqlite":
            self.engine: Engine = sa.create_engine(self.url, connect_args={"timeout": 10})
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            self.engine = sa.create_engine(self.url, pool_pre_ping=True, pool_size=4, max_overflow=4,
                                           connect_args={"connect_timeout": max(1, int(connect_timeout))})
        self._migrated = False
        self._prepared: _Upserts | None = None

    def close(self) -> None:
        self.engine.dispose()

    # ---- schema ---------------------------------------------------------------------------------

    def migrate(self) -> int:
        """Bring the schema to SCHEMA_VERSION; returns the version found before."""
        try:
            with self.engine.begin() as conn:
                if self.dialect == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
                schema_table.create(conn, checkfirst=True)
                found = conn.execute(sa.select(sa.func.max(schema_table.c.version))).scalar() or 0
                if found > SCHEMA_VERSION:
                    raise StoreError(f"the history schema is at version {found}, newer than this release's "
                                     f"{SCHEMA_VERSION}: upgrade the masters")
                for version, step in MIGRATIONS:
                    if version > found:
                        step(conn)
                        conn.execute(schema_table.insert().values(version=version))
                        log.info("history schema migrated version=%d", version)
        except SQLAlchemyError as exc:
            raise StoreError(_why(exc)) from None
        self._migrated = True
        return found

    def _ready(self) -> None:
        if self._migrated:
            return
        try:
            with self.engine.connect() as conn:
                version = conn.execute(sa.select(sa.func.max(schema_table.c.version))).scalar() or 0
        except SQLAlchemyError as exc:
            raise StoreError(f"history store not initialised or unreachable: {_why(exc)}") from None
        if version != SCHEMA_VERSION:
            raise StoreError(f"history schema is at version {version}, this release reads {SCHEMA_VERSION}")
        self._migrated = True

    # ---- writing ----------------------------------------------------------------------------------

    def cursor(self) -> int:
        """The archive sequence number up to which the store holds every finished job."""
        self._ready()
        try:
            with self.engine.connect() as conn:
                return int(conn.execute(sa.select(cursor_table.c.upto).where(cursor_table.c.id == 1)).scalar() or 0)
        except SQLAlchemyError as exc:
            raise StoreError(_why(exc)) from None

    def export(self, records: Sequence[JobRecord], expected: int, upto: int, at: float) -> int:
        """Upsert the records and move the cursor from `expected` to `upto`, in one transaction.
        Raises CursorMoved (writing nothing) if the cursor is no longer `expected`. Returns the
        number of job rows that were new."""
        self._ready()
        try:
            with self.engine.begin() as conn:
                moved = conn.execute(cursor_table.update().where(cursor_table.c.id == 1)
                                     .where(cursor_table.c.upto == expected)
                                     .values(upto=upto, updated_at=at)).rowcount
                if moved != 1:  # raising rolls the transaction back
                    raise CursorMoved(f"the history cursor is no longer {expected}: another exporter wrote")
                return self._write(conn, records)
        except SQLAlchemyError as exc:
            raise StoreError(_why(exc)) from None

    def _write(self, conn: Connection, records: Sequence[JobRecord]) -> int:
        if not records:
            return 0
        ids = [r.job_id for r in records]
        known_jobs: set[str] = set()
        known_runs: set[tuple[str, int]] = set()
        for chunk in _chunks(ids, 900):
            known_jobs.update(conn.execute(_KNOWN_JOBS, {"ids": chunk}).scalars())
            known_runs.update((j, a) for j, a in conn.execute(_KNOWN_RUNS, {"ids": chunk}))
        upserts = self._upserts()
        upserts.jobs.run(conn, [job_row(r) for r in records])
        new_runs = [run for r in records for run in r.runs if (run.job_id, run.attempt) not in known_runs]
        if new_runs:
            upserts.runs.run(conn, [run_row(run) for run in new_runs])
        usage = usage_rows(new_runs, [r for r in records if r.job_id not in known_jobs])
        if usage:
            upserts.usage.run(conn, usage)
        return len(records) - len(known_jobs)

    def _upserts(self) -> _Upserts:
        """The export's three writes, compiled for this store's dialect at the first export."""
        if self._prepared is None:
            insert = self._insert(jobs)
            job_upsert = insert.on_conflict_do_update(
                index_elements=[jobs.c.job_id],
                set_={c.name: insert.excluded[c.name] for c in jobs.c if c.name != "job_id"})
            run_insert = self._insert(runs).on_conflict_do_nothing(index_elements=[runs.c.job_id, runs.c.attempt])
            insert = self._insert(usage_daily)
            usage_upsert = insert.on_conflict_do_update(
                index_elements=[usage_daily.c.day, usage_daily.c.user_name, usage_daily.c.queue],
                set_={"gpu_seconds": usage_daily.c.gpu_seconds + insert.excluded.gpu_seconds,
                      "cpu_seconds": usage_daily.c.cpu_seconds + insert.excluded.cpu_seconds,
                      "jobs": usage_daily.c.jobs + insert.excluded.jobs,
                      **{name: usage_daily.c[name] + insert.excluded[name] for name in GOODPUT_COLUMNS}})
            dialect = self.engine.dialect
            self._prepared = _Upserts(*(_Upsert(statement, tuple(c.name for c in table.c), dialect, SQLITE_MAX_PARAMS)
                                        for statement, table in ((job_upsert, jobs), (run_insert, runs),
                                                                 (usage_upsert, usage_daily))))
        return self._prepared

    def _insert(self, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as postgresql_insert

            return postgresql_insert(table)
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table)

    def add_utilization(self, sample: ClusterSample, now: float, max_gap: float = UTILIZATION_MAX_GAP_S) -> float:
        """Add `sample` held since the last sample (at most `max_gap`) to the days' cluster rows,
        and mark `now` sampled, in one transaction; returns the seconds counted (0 when another
        leader has sampled up to now already)."""
        self._ready()
        try:
            with self.engine.begin() as conn:
                last = conn.execute(sa.select(cluster_sampled.c.at).where(cluster_sampled.c.id == 1)).scalar() or 0.0
                rows = utilization_rows(sample, last, now, max_gap)
                if not rows and last:  # sampled up to now already
                    return 0.0
                # the first sample only starts the clock: the cluster's time before it is unknown
                moved = conn.execute(cluster_sampled.update().where(cluster_sampled.c.id == 1)
                                     .where(cluster_sampled.c.at == last).values(at=now)).rowcount
                if moved != 1 or not rows:  # another leader sampled meanwhile: its seconds stand
                    return 0.0
                insert = self._insert(cluster_daily)
                conn.execute(insert.on_conflict_do_update(
                    index_elements=[cluster_daily.c.day],
                    set_={name: cluster_daily.c[name] + insert.excluded[name] for name in CLUSTER_COLUMNS}), rows)
                return now - max(last, now - max_gap)
        except SQLAlchemyError as exc:
            raise StoreError(_why(exc)) from None

    def purge(self, before: float) -> int:
        """Delete jobs and runs that ended before `before` (the daily usage stays); returns jobs deleted."""
        self._ready()
        try:
            with self.engine.begin() as conn:
                conn.execute(runs.delete().where(runs.c.end_at < before))
                return conn.execute(jobs.delete().where(jobs.c.end_at < before)).rowcount
        except SQLAlchemyError as exc:
            raise StoreError(_why(exc)) from None

    # ---- reading ----------------------------------------------------------------------------------

    def jobs(self, q: JobQuery) -> tuple[list[dict[str, Any]], bool]:
        """The jobs matching, ordered by end then id, each with its runs; and whether more follow."""
        self._ready()
        limit = max(1, min(q.limit, MAX_PAGE))
        stmt = sa.select(jobs)
        for column, value in ((jobs.c.user_name, q.user), (jobs.c.queue, q.queue), (jobs.c.state, q.state),
                              (jobs.c.job_id, q.job_id)):
            if value:
                stmt = stmt.where(column == value)
        if q.since:
            stmt = stmt.where(jobs.c.end_at >= q.since)
        if q.until:
            stmt = stmt.where(jobs.c.end_at < q.until)
        if q.after_id:
            stmt = stmt.where(sa.or_(jobs.c.end_at > q.after_end,
                                     sa.and_(jobs.c.end_at == q.after_end, jobs.c.job_id > q.after_id)))
        stmt = stmt.order_by(jobs.c.end_at, jobs.c.job_id).limit(limit + 1)
        try:
            with self.engine.connect() as conn:
                found = _dicts(conn.execute(stmt))
                more = len(found) > limit
                found = found[:limit]
                by_id = {row["job_id"]: row for row in found}
                for row in found:
                    row["runs"] = []
                for chunk in _chunks(list(by_id), 900):
                    for run in _dicts(conn.execute(sa.select(runs).where(runs.c.job_id.in_(chunk))
                                                   .order_by(runs.c.job_id, runs.c.attempt))):
                        by_id[run["job_id"]]["runs"].append(run)
        except SQLAlchemyError as exc:
            raise StoreError(_why(exc)) from None
        return found, more

    def usage(self, by: str, since: float, until: float) -> list[dict[str, Any]]:
        """GPU- and CPU-seconds and jobs per user, queue or UTC day (`day,queue`: per both, keys
        `key` and `queue`), over the days [since, until]."""
        columns = {"user": [usage_daily.c.user_name], "queue": [usage_daily.c.queue], "day": [usage_daily.c.day],
                   "day,queue": [usage_daily.c.day, usage_daily.c.queue]}[by]
        self._ready()
        keys = [columns[0].label("key"), *columns[1:]]
        stmt = (sa.select(*keys, sa.func.sum(usage_daily.c.gpu_seconds).label("gpu_seconds"),
                          sa.func.sum(usage_daily.c.cpu_seconds).label("cpu_seconds"),
                          sa.func.sum(usage_daily.c.jobs).label("jobs"),
                          *(sa.func.sum(usage_daily.c[name]).label(name) for name in GOODPUT_COLUMNS))
                .group_by(*columns).order_by(*columns))
        return self._days(stmt, usage_daily.c.day, since, until)

    def cluster_usage(self, since: float, until: float) -> list[dict[str, Any]]:
        """The cluster's allocated, idle and down GPU- and CPU-seconds per UTC day over [since, until]."""
        self._ready()
        return self._days(sa.select(cluster_daily).order_by(cluster_daily.c.day), cluster_daily.c.day, since, until)

    def _days(self, stmt: sa.Select[*tuple[Any, ...]], day: sa.Column[str], since: float,
              until: float) -> list[dict[str, Any]]:
        """The rows of `stmt` on the UTC days [since, until] (0: unbounded)."""
        if since:
            stmt = stmt.where(day >= day_of(since))
        if until:
            stmt = stmt.where(day <= day_of(until))
        try:
            with self.engine.connect() as conn:
                return _dicts(conn.execute(stmt))
        except SQLAlchemyError as exc:
            raise StoreError(_why(exc)) from None


def _dicts(result: sa.CursorResult[*tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Every row as a dict (fetched at once, its keys read once: per-row mappings cost more than
    the query on a page of a thousand)."""
    keys = list(result.keys())
    return [dict(zip(keys, row, strict=True)) for row in result.all()]


def _sqlite_pragmas(dbapi_connection: sqlite3.Connection, _record: object) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers on other replicas never block the exporter
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _why(exc: SQLAlchemyError) -> str:
    """One line: the driver's message without SQLAlchemy's background link and statement dump."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"{type(getattr(exc, 'orig', None) or exc).__name__}: {text[0] if text else ''}"[:400]


def _chunks(items: list[_T], size: int) -> Iterable[list[_T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
