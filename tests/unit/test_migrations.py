"""The warehouse migrations as files: one version each, read in order (no server needed).

Two branches that each add the next migration pick the same number; the migration runner
refuses duplicate versions at start, so every service would fail to come up. Caught here first."""
from __future__ import annotations

from infra.clickhouse.migrate import MIGRATIONS_DIR, load_migrations


def test_every_migration_has_its_own_version_in_order():
    versions = [m.version for m in load_migrations(MIGRATIONS_DIR)]
    assert versions == sorted(set(versions)), versions
    assert versions[0] == 1


def test_window_agg_gains_disk_hits_after_hits():
    migration = {m.version: m for m in load_migrations(MIGRATIONS_DIR)}[14]
    assert "ALTER TABLE window_agg ADD COLUMN IF NOT EXISTS disk_hits Int64 DEFAULT 0 AFTER hits" in migration.sql
