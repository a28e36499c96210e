"""How long a demotion holds the store when the disk tier's lists grow: inline vs background k-means.

    python -m bench.disk_tier_growth [--size 65536] [--out disk_tier_growth]

One scope of a ``DiskTier`` is bulk-filled (``put_many``, inline training) to just below ``--size``,
where its codes call for twice the lists (65,536 rows: 512 -> 1,024 lists, the last growth), then
demoted into one row at a time across that point, once with the k-means inline (the old way) and once
on a background thread (``train_in_background``). Each ``put`` runs under the partition's lock in the
service, so its wall time is how long the store's lookups wait; the timed puts come at ``--rate`` a
second, a busy store's demotions. Reports per mode the longest put, the
put that started the growth and the one that swapped the trained lists in, and the puts in between.
Vectors: banking77 encodings with noise (bench.index_kinds' corpus).

Prints a table; writes bench/results/<out>.{json,png}.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.index_kinds import corpus, encoded, unit
from cache_core.records import CacheEntry, entry_bytes
from cache_core.store.disk_tier import DiskTier

RESULTS = Path(__file__).resolve().parent / "results"
QUERY = "How do I know if my card has been delivered to the right address?"
ANSWER = "Your card is on its way: you can follow its delivery in the app under Card > Track."


def _entry(i: int, vec: np.ndarray, now: float) -> CacheEntry:
    return CacheEntry(entry_id=f"e{i}", query=QUERY, embedding=vec, answer=ANSWER, created_at=now, ttl_s=86400.0,
                      ttl_policy="absolute", max_age_s=86400.0, namespace="bench", intent_cluster=-1,
                      approx_bytes=entry_bytes(QUERY, ANSWER, vec))


def grow(vecs: np.ndarray, size: int, background: bool, after: int, rate: float) -> dict:
    """Fill to ``size - 1``, then time single puts until the new lists are in (and ``after`` more)."""
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tier = DiskTier(Path(tmp) / "tier.sqlite", vecs.shape[1], len(vecs) + 1, train_in_background=False)
        for start in range(0, size - 1, 10_000):
            tier.put_many([_entry(i, vecs[i], now) for i in range(start, min(start + 10_000, size - 1))])
        tier.train_in_background = background
        before, times, i = tier.rebuilds, [], size - 1
        while (tier.rebuilds == before or len(times) < after) and i < len(vecs):
            started = time.perf_counter()
            tier.put(_entry(i, vecs[i], now))
            times.append(time.perf_counter() - started)
            i += 1
            time.sleep(max(0.0, 1 / rate - (time.perf_counter() - started)))  # demotions at a store's pace
        nlist = tier._codes[""].nlist
        tier.close()
    ms = np.array(times) * 1000
    return {"mode": "background" if background else "inline", "puts": len(ms), "lists_after": nlist,
            "first_put_ms": round(float(ms[0]), 1), "max_put_ms": round(float(ms.max()), 1),
            "p50_put_ms": round(float(np.median(ms)), 2), "put_ms": [round(float(t), 2) for t in ms]}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for row in rows:
        ax.plot(row["put_ms"], marker=".", linewidth=0.8, label=f"{row['mode']} (longest {row['max_put_ms']:.0f} ms)")
    ax.set_yscale("log")
    ax.set_xlabel("demotion, from the one that finds the codes outgrown")
    ax.set_ylabel("put wall time (ms, log)")
    ax.set_title("Disk tier growing to 1,024 lists: how long one demotion holds the store")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=65_536)
    parser.add_argument("--after", type=int, default=50, help="puts timed past the start at least")
    parser.add_argument("--rate", type=float, default=200.0, help="demotions per second while timed")
    parser.add_argument("--out", default="disk_tier_growth")
    args = parser.parse_args(argv)
    vecs = corpus(unit(encoded("train")), args.size + 20_000)
    rows = [grow(vecs, args.size, background, args.after, args.rate) for background in (False, True)]
    print("| mode | puts timed | lists after | first put | longest put | median put |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['mode']} | {row['puts']} | {row['lists_after']} | {row['first_put_ms']} ms | "
              f"{row['max_put_ms']} ms | {row['p50_put_ms']} ms |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(rows, indent=1))
    plot(rows, RESULTS / f"{args.out}.png")
    return rows


if __name__ == "__main__":
    main()
