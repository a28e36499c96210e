"""Seed a running cache from a file of answers: ``python -m cache_core.seed FILE [--url URL]``.

For a knowledge base, an FAQ or last month's logged answers, so that the cache does not
start cold. FILE is JSON Lines (one object per line) or CSV with a header; each record
has ``query`` and ``answer`` and may have ``namespace``, ``scope``, ``ttl_s``,
``experiment_id``, ``provenance_source`` / ``provenance_version`` (or, in JSON, a
``provenance`` object). By default every record goes into every arm's store of its
experiment (``every_arm``), so that no arm starts warmer than another; ``--unit-arm-only``
stores into the arm of ``--unit-id`` instead.

The whole file is checked before anything is sent: a bad record is reported with its
line number and nothing is stored. Records go out in batches (``POST /v1/store/batch``);
if the service refuses one, the batches before it stay stored and the message says how
far it got, so the rest can be sent again with ``--skip``.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path

import httpx
from tqdm import tqdm

from cache_core.service.schemas import MAX_STORE_BATCH

FIELDS = ("query", "answer", "namespace", "scope", "ttl_s", "experiment_id", "provenance_source",
          "provenance_version")
MAX_REPORTED = 10


class SeedError(ValueError):
    """A file or record the seeder refuses (printed as a message, exit 2)."""


class SeedAborted(SeedError):
    """The service refused a batch or did not answer (exit 1; the batches before it are stored)."""


def read_records(path: Path) -> list[tuple[int, dict]]:
    """(line number, raw record) of a JSON Lines, CSV or TSV (``.tsv``) file."""
    if not path.exists():
        raise SeedError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:  # a directory, no permission, ...
        raise SeedError(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise SeedError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if path.suffix.lower() in (".csv", ".tsv"):
        # A stream, not split lines: a quoted field may hold a newline (user questions do).
        reader = csv.DictReader(io.StringIO(text, newline=""),
                                delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
        return [(reader.line_num, dict(row)) for row in reader]
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            records.append((number, SeedError(f"not JSON ({exc.msg})")))
    return records


def store_item(raw, unit_id: str, defaults: dict) -> dict:
    """The /v1/store body of one record (SeedError with the reason if it is not one)."""
    if isinstance(raw, SeedError):
        raise raw
    if not isinstance(raw, dict):
        raise SeedError("a record must be an object with query and answer")
    provenance = raw.get("provenance") or {}
    unknown = set(raw) - set(FIELDS) - {"provenance"}
    if unknown:
        raise SeedError(f"unknown fields {sorted(unknown)}; known: {list(FIELDS)}")
    item = {"unit_id": unit_id, **defaults}
    for name in ("query", "answer"):
        if not isinstance(raw.get(name), str) or not raw[name].strip():
            raise SeedError(f"{name} must be a non-empty string")
        item[name] = raw[name]
    for name in ("namespace", "scope", "experiment_id"):
        if raw.get(name) not in (None, ""):
            item[name] = str(raw[name])
    if raw.get("ttl_s") not in (None, ""):
        try:
            item["ttl_s"] = float(raw["ttl_s"])
        except (TypeError, ValueError):
            raise SeedError(f"ttl_s must be a number, got {raw['ttl_s']!r}") from None
        if not item["ttl_s"] > 0:
            raise SeedError("ttl_s must be positive")
    item["provenance"] = {"source": str(raw.get("provenance_source") or provenance.get("source") or "seed"),
                          "version": str(raw.get("provenance_version") or provenance.get("version") or "")}
    return item


def checked_items(path: Path, unit_id: str, defaults: dict) -> list[dict]:
    items, problems = [], []
    for number, raw in read_records(path):
        try:
            items.append(store_item(raw, unit_id, defaults))
        except SeedError as exc:
            problems.append(f"{path}:{number}: {exc}")
    if problems:
        shown = "\n".join(problems[:MAX_REPORTED])
        more = f"\n... and {len(problems) - MAX_REPORTED} more" if len(problems) > MAX_REPORTED else ""
        raise SeedError(f"{len(problems)} bad records, nothing sent:\n{shown}{more}")
    if not items:
        raise SeedError(f"{path}: no records")
    return items


def send(client: httpx.Client, items: list[dict], batch: int, every_arm: bool, skip: int) -> tuple[dict, int]:
    """POST the items in batches; returns (counts by store reason, entries stored). Raises
    SeedAborted when a batch is refused or the service does not answer."""
    reasons: dict[str, int] = {}
    stored = 0
    sent = skip
    with tqdm(total=len(items), initial=skip, unit="record", file=sys.stderr, desc="seeding") as bar:
        for start in range(skip, len(items), batch):
            chunk = items[start:start + batch]
            try:
                response = client.post("/v1/store/batch", json={"items": chunk, "every_arm": every_arm})
            except httpx.HTTPError as exc:
                raise SeedAborted(f"the cache did not answer ({exc}); {_stored_so_far(sent)}") from None
            if response.status_code != 200:
                raise SeedAborted(f"the cache refused records {start}-{start + len(chunk) - 1} "
                                  f"({response.status_code}: {_detail(response)}); {_stored_so_far(start)}")
            for per_item in response.json()["results"]:
                for result in per_item:
                    reasons[result["reason"]] = reasons.get(result["reason"], 0) + 1
                    stored += result["stored"]
            sent = start + len(chunk)
            bar.update(len(chunk))
    return reasons, stored


def _stored_so_far(sent: int) -> str:
    if not sent:
        return "nothing was stored"
    return f"records 0-{sent - 1} are stored, resume with --skip {sent}"


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail"))
    except ValueError:
        return response.text[:200]


def main(argv: list[str] | None = None, client: httpx.Client | None = None) -> int:
    from cache_core.settings import settings_or_exit

    parser = argparse.ArgumentParser(prog="python -m cache_core.seed", description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="JSON Lines, .csv or .tsv with query and answer per record")
    parser.add_argument("--url", help="cache service base URL (default: this machine's SCACHE_SERVICE__PORT)")
    parser.add_argument("--namespace", help="namespace of records that name none")
    parser.add_argument("--experiment", help="experiment of records that name none (default: the service's)")
    parser.add_argument("--unit-id", default="seed", help="the unit the stores are made for")
    parser.add_argument("--unit-arm-only", action="store_true",
                        help="store into the arm of --unit-id only, not into every arm")
    parser.add_argument("--batch", type=int, default=256, help=f"records per request (1-{MAX_STORE_BATCH})")
    parser.add_argument("--skip", type=int, default=0, help="records already stored by an earlier run")
    parser.add_argument("--api-key", default=os.environ.get("SCACHE_API_KEY"),
                        help="a client key with the write right (default: $SCACHE_API_KEY; none: open access)")
    args = parser.parse_args(argv)
    if not 1 <= args.batch <= MAX_STORE_BATCH or args.skip < 0:
        parser.error(f"--batch must be 1-{MAX_STORE_BATCH} and --skip >= 0")
    defaults = {k: v for k, v in (("namespace", args.namespace), ("experiment_id", args.experiment)) if v}
    own = client is None
    try:
        client = client or httpx.Client(base_url=args.url or f"http://127.0.0.1:{settings_or_exit('seed').service.port}",
                                        timeout=120,
                                        headers={"x-scache-api-key": args.api_key} if args.api_key else None)
    except httpx.InvalidURL as exc:
        parser.error(f"--url {args.url!r}: {exc}")
    try:
        items = checked_items(args.file, args.unit_id, defaults)
        if args.skip > len(items):
            raise SeedError(f"--skip {args.skip} is past the file's {len(items)} records")
        reasons, stored = send(client, items, args.batch, not args.unit_arm_only, args.skip)
    except SeedError as exc:
        print(f"seed: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, SeedAborted) else 2
    finally:
        if own:
            client.close()
    print(f"seeded {len(items) - args.skip} records: {stored} entries stored "
          f"({', '.join(f'{r} {n}' for r, n in sorted(reasons.items()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
