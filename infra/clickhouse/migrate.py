"""Versioned, idempotent ClickHouse migrations.

Files ``migrations/NNNN_name.sql`` are applied in order, each once: the
``schema_migrations`` table in the target database records the version, file
name and checksum of every applied file. A recorded file whose text has since
changed is an error (write a new migration instead of editing an applied one).

    python -m infra.clickhouse.migrate      # uses SCACHE_CLICKHOUSE__* settings
"""
from __future__ import annotations

import hashlib
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from clickhouse_connect.driver import Client
from clickhouse_connect.driver.exceptions import ClickHouseError as ClientError

from infra.clickhouse.sqltext import split_statements

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_FILE_NAME = re.compile(r"(\d{4})_[a-z0-9_]+\.sql\Z")
_DATABASE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations
(
    version UInt32,
    name String,
    checksum String,
    applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
ORDER BY version
"""


class MigrationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    def statements(self) -> list[str]:
        return split_statements(self.sql)


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Migration files of ``directory`` in version order; badly named files are an error."""
    migrations = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise MigrationError(f"migration file name must look like 0001_name.sql: {path.name}")
        migrations.append(Migration(int(match.group(1)), path.name, path.read_text()))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {directory}: {versions}")
    return migrations


def _applied(client: Client, database: str) -> dict[int, str]:
    rows = client.query(
        "SELECT version, argMax(checksum, applied_at) FROM schema_migrations GROUP BY version",
        settings={"database": database},
    ).result_rows
    return {int(version): checksum for version, checksum in rows}


def apply_migrations(client: Client, database: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Create ``database`` if needed and apply every pending migration; returns the files applied.

    Safe to run again (and concurrently with readers): applied files are skipped,
    and every statement is itself idempotent (``IF NOT EXISTS``).
    """
    if not _DATABASE_NAME.match(database):
        raise MigrationError(f"database name must be a plain identifier, got {database!r}")
    # The name is validated above; DDL cannot take it as a bound parameter.
    client.command(f"CREATE DATABASE IF NOT EXISTS `{database}`", use_database=False)
    in_db = {"database": database}
    client.command(_LEDGER_DDL, settings=in_db)
    applied = _applied(client, database)
    done = []
    for migration in load_migrations(directory):
        recorded = applied.get(migration.version)
        if recorded is not None:
            if recorded != migration.checksum:
                raise MigrationError(f"{migration.name} changed after it was applied to {database}; add a new migration instead")
            continue
        for statement in migration.statements():
            client.command(statement, settings=in_db)
        client.insert("schema_migrations", [[migration.version, migration.name, migration.checksum]],
                      column_names=["version", "name", "checksum"], database=database)
        log.info("applied migration", extra={"migration": migration.name, "database": database})
        done.append(migration.name)
    return done


def main(argv: list[str] | None = None) -> int:
    import argparse

    from cache_core.chclient import connect
    from cache_core.logs import configure_logging
    from cache_core.settings import settings_or_exit

    parser = argparse.ArgumentParser(prog="python -m infra.clickhouse.migrate",
                                     description="Apply pending ClickHouse migrations to the database of "
                                                 "SCACHE_CLICKHOUSE__* settings (safe to repeat).")
    parser.parse_args(argv)
    settings = settings_or_exit("migrate")
    configure_logging(settings.log_level, settings.log_format)
    try:
        # Connect to "default": the target database may not exist yet.
        client = connect(settings.clickhouse, database="default")
        applied = apply_migrations(client, settings.clickhouse.database)
    except (MigrationError, ClientError) as exc:
        print(f"migrate: {exc}", file=sys.stderr)
        return 1
    print(f"migrate: {settings.clickhouse.database}: applied {applied or 'nothing (up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
