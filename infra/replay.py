"""Send your own query log through a running cache and print the per-arm summary.

    python -m infra.replay FILE [--rate N] [--url URL] [--experiment ID]   (or: ./scache replay FILE)

FILE is JSON Lines (one object per line) or CSV with a header (``.csv``). Each record has ``query`` and may
have ``unit`` (the user or session; else one of 500 synthetic users), ``namespace``, ``timestamp`` (seconds
since the epoch, or ISO 8601), ``answer`` (the expected answer) and ``label`` (the answer's class, e.g. an
intent). Each query is looked up as an application would; on a miss its answer is stored (the expected
answer, else a canned answer per label, else a placeholder). A hit is judged when the record says what is
right (same label, or the expected answer) and the verdict goes back through ``/v1/feedback``, as a user's
thumbs-up or -down would. Records are sent at their recorded pace (the gaps between timestamps), or at
``--rate`` per second (also when the log has no timestamps; default 10).

The whole file is checked first: a bad record is reported with its line number and nothing is sent.
Without ``--url`` the cache of a running ``./scache serve`` (else ``./scache demo``) is used.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx

from cache_core.seed import SeedError, read_records
from cache_core.runtime import scache_home
from infra.traffic import Judge, Query, Tally, drive

FIELDS = {"query": "query", "text": "query", "unit": "unit", "unit_id": "unit", "namespace": "namespace",
          "timestamp": "timestamp", "ts": "timestamp", "answer": "answer", "expected_answer": "answer",
          "label": "label"}
DEFAULT_RATE = 10.0
USERS = 500
MAX_REPORTED = 10


class ReplayError(ValueError):
    """A file, record or setting replay refuses (one line on stderr, exit 2)."""


def parse_timestamp(value) -> float:
    """Seconds since the epoch, from a number (seconds; milliseconds above 1e11) or ISO 8601 text."""
    if isinstance(value, bool):
        raise ReplayError(f"timestamp must be a number or ISO 8601 text, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            try:
                return datetime.fromisoformat(value.strip()).timestamp()
            except ValueError:
                raise ReplayError(f"timestamp {value!r} is neither a number nor ISO 8601") from None
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ReplayError(f"timestamp must be a non-negative number or ISO 8601 text, got {value!r}")
    return value / 1000 if value > 1e11 else float(value)


def to_query(raw, rng: random.Random) -> Query:
    """The Query of one record (ReplayError with the reason if it is not one)."""
    if isinstance(raw, SeedError):
        raise ReplayError(str(raw))
    if not isinstance(raw, dict):
        raise ReplayError("a record must be an object with a query")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ReplayError(f"unknown fields {unknown}; known: {sorted(FIELDS)}")
    record = {FIELDS[name]: value for name, value in raw.items() if value not in (None, "")}
    text = record.get("query")
    if not isinstance(text, str) or not text.strip():
        raise ReplayError("query must be a non-empty string")
    for name in ("unit", "namespace", "answer", "label"):
        if name in record and not isinstance(record[name], (str, int)):
            raise ReplayError(f"{name} must be text, got {record[name]!r}")
    at_s = parse_timestamp(record["timestamp"]) if "timestamp" in record else None
    unit = str(record["unit"]) if "unit" in record else f"user-{rng.randrange(USERS)}"
    return Query(text=text, unit_id=unit, answer=_text(record.get("answer")), label=_text(record.get("label")),
                 namespace=_text(record.get("namespace")), at_s=at_s)


def _text(value) -> str | None:
    return None if value is None else str(value)


def read_log(path: Path) -> list[Query]:
    """Every record of the log, checked; ReplayError naming the bad lines (nothing is sent then)."""
    try:
        records = read_records(path)
    except SeedError as exc:
        raise ReplayError(str(exc)) from None
    rng = random.Random(7)
    queries, problems = [], []
    for number, raw in records:
        try:
            queries.append(to_query(raw, rng))
        except ReplayError as exc:
            problems.append(f"{path}:{number}: {exc}")
    if problems:
        more = f" (and {len(problems) - 1} more bad records)" if len(problems) > 1 else ""
        raise ReplayError(f"{problems[0]}{more}; nothing sent")
    if not queries:
        raise ReplayError(f"{path}: no records")
    return queries


def schedule(queries: list[Query], rate: float | None) -> Iterator[tuple[float, Query]]:
    """(offset in seconds, query): ``rate`` per second when given or when a record has no timestamp,
    else the recorded gaps (in file order; an earlier timestamp than the one before goes at once)."""
    if rate is None and all(q.at_s is not None for q in queries):
        first = queries[0].at_s
        latest = 0.0
        for query in queries:
            latest = max(latest, query.at_s - first)
            yield latest, query
        return
    step = 1.0 / (rate or DEFAULT_RATE)
    for i, query in enumerate(queries):
        yield i * step, query


def running_cache_url() -> str:
    """The cache URL of a running ``./scache serve`` (else demo) on this machine."""
    for name in ("serve", "demo"):
        url = read_stack_file(scache_home() / name)
        if url:
            return url
    raise ReplayError("no running cache found (start ./scache serve, or pass --url)")


def read_stack_file(state_dir: Path) -> str | None:
    """The cache URL that a running stack wrote to ``state_dir/stack.json`` (None if none runs there)."""
    try:
        info = json.loads((state_dir / "stack.json").read_text())
        pid, url = int(info["pid"]), str(info["cache_url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return url


def replay(client: httpx.Client, queries: list[Query], rate: float | None, experiment_id: str | None,
           tally: Tally) -> int:
    """Send the queries (see ``schedule``); returns how many were sent."""
    return drive(client, schedule(queries, rate), experiment_id, tally, Judge())


def main(argv: list[str] | None = None, client: httpx.Client | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.replay", description=__doc__.splitlines()[0],
                                     epilog="Record fields: " + ", ".join(sorted(FIELDS)))
    parser.add_argument("file", type=Path, help="JSON Lines, or .csv with a header")
    parser.add_argument("--rate", type=float, help=f"requests per second (default: the recorded pace, "
                                                   f"else {DEFAULT_RATE:g})")
    parser.add_argument("--url", help="cache base URL (default: the running ./scache serve or demo)")
    parser.add_argument("--experiment", help="experiment id (default: the service's)")
    args = parser.parse_args(argv)
    if args.rate is not None and not 0 < args.rate < math.inf:
        parser.error("--rate must be a positive number")
    from cache_core.logs import configure_logging

    configure_logging()
    tally, queries = Tally(), []
    try:
        queries = read_log(args.file)
        own = client is None
        if own:
            try:
                client = httpx.Client(base_url=args.url or running_cache_url(), timeout=30)
            except httpx.InvalidURL as exc:
                raise ReplayError(f"--url {args.url!r}: {exc}") from None
        try:
            paced = "recorded pace" if args.rate is None and all(q.at_s is not None for q in queries) else \
                f"{args.rate or DEFAULT_RATE:g}/s"
            print(f"replaying {len(queries)} queries from {args.file} to {client.base_url} ({paced}); "
                  "Ctrl-C stops", flush=True)
            replay(client, queries, args.rate, args.experiment, tally)
        finally:
            if own:
                client.close()
    except ReplayError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPStatusError as exc:
        print(f"replay: the cache refused a request ({exc.response.status_code}: {exc.response.text[:200]})",
              file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"replay: the cache did not answer ({exc})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("replay: interrupted", file=sys.stderr)
    print(f"sent {sum(tally.requests.values())} of {len(queries)}: {tally.line() or 'nothing answered'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
