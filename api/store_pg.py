"""The PostgreSQL store (psycopg 3 with its connection pool): the same SQL as the SQLite store
(api/store.py), with the database's clock for leases, `FOR UPDATE SKIP LOCKED` so replicas
claim different jobs without waiting on each other, and an advisory lock that makes the
queue limit's count-then-insert atomic across replicas."""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from api.store import Query, Store

# pg_advisory_*lock keys: arbitrary constants of this application.
_ADMISSION_LOCK = 0x706C616E_0001  # "plan" 1
_MIGRATION_LOCK = 0x706C616E_0002


class PostgresStore(Store):
    now_sql = "(EXTRACT(EPOCH FROM clock_timestamp())::double precision)"
    skip_locked = " FOR UPDATE SKIP LOCKED"
    kind = "postgresql"

    def __init__(self, url: str, migrate: bool = True, max_connections: int = 8,
                 connect_timeout_s: float = 10.0) -> None:
        self.url = url
        self._pool = ConnectionPool(url, min_size=1, max_size=max_connections, open=False,
                                    kwargs={"autocommit": True,
                                            "connect_timeout": int(connect_timeout_s)},
                                    timeout=connect_timeout_s, name="planner")
        self._pool.open(wait=True, timeout=connect_timeout_s)
        if migrate:
            self.migrate()

    @staticmethod
    def _query(conn: psycopg.Connection[Any]) -> Query:
        def q(sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
            return conn.execute(sql.replace("?", "%s"), tuple(params))  # type: ignore[arg-type]

        return q

    @contextmanager
    def _tx(self) -> Iterator[Query]:
        with self._pool.connection() as conn, conn.transaction():
            yield self._query(conn)

    @contextmanager
    def _read(self) -> Iterator[Query]:
        with self._pool.connection() as conn:
            yield self._query(conn)

    def _lock_admission(self, q: Query) -> None:
        q("SELECT pg_advisory_xact_lock(?)", (_ADMISSION_LOCK,))

    @contextmanager
    def _migration_lock(self) -> Iterator[None]:
        with self._pool.connection() as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
            try:
                yield
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))

    def schema_version(self) -> int:
        with self._read() as q:
            exists = q("SELECT to_regclass('schema_migrations')").fetchone()[0]
            if exists is None:
                return 0
            row = q("SELECT MAX(version) FROM schema_migrations").fetchone()
        return int(row[0] or 0)

    def close(self) -> None:
        self._pool.close(timeout=1.0)
