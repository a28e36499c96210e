"""scache vs GPTCache on the shared labelled data, side by side, in one run.

    python -m bench.compare_gptcache [--banking-queries 1000] [--backends torch onnx]

scache runs in-process (SemanticCache, the real encoder, flat index); GPTCache
runs in its own venv (bench/setup_gptcache.sh creates it) via bench/gptcache_side.py,
with the same MiniLM weights. Both replay identical query lists:

* ``mock``: GPTCache's own mock_data.json; each ``origin`` stored with its index as
  answer, each ``similar`` asked (own index = correct hit, other = false hit), plus
  999 banking77 test queries as unrelated traffic (any hit = false hit).
* ``banking77``: train warms the cache (answer = intent), a test sample is traffic;
  a hit whose cached query has another intent is a false hit.

``scache-<backend>-multi-strict`` rows: the same with a strict answer margin (word
overlap, margin 0.04: the earlier defaults), to show what that knob trades.
``scache-<backend>-multi`` rows: an arm with ``similarity="multi"`` (top-k re-ranked
by the mixed token / phrase / intent score with the answer margin, defaults of
``MultiSimilarityConfig``, tuned on the GPTCache mock pairs with even index and on
a banking77 *train* split, never on banking77 test) at each cosine threshold; one
real decision per threshold (one shared store, one arm per threshold).
``mock-odd`` counts the mock rows whose pair index is odd (not used for tuning).
``mock-unique`` (and ``mock-odd-unique``) leave out the pairs whose origin text is
stored more than once under different indices (63 of 999 rows share 28 texts): identical cached
questions with different answers, where any cache's answer is a coin toss.

Thresholds are compared on the cosine scale. GPTCache's threshold t (distance
evaluation over squared L2 of unit vectors) means cosine 2t - 1: its 0.95, 0.9,
0.8 are cosine 0.90, 0.80, 0.60. The threshold curve (banking77 hits and STS-B /
MRPC pairs) goes to bench/results/threshold_curves.png, figures to
bench/results/compare_gptcache.{json,md}, correct vs false hits to
bench/results/correct_vs_false.png.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from cache_core.cache import SemanticCache
from cache_core.embedding.embedder import normalise, resolve_model_path
from cache_core.embedding.load import load_embedder
from cache_core.experiments import ArmConfig, ExperimentConfig, MultiSimilarityConfig, assign
from cache_core.store.faiss import set_search_threads
from cache_core.registry import ExperimentRegistry
from cache_core.settings import CacheSettings
from infra.runtime import shared_data_dir

DATA = shared_data_dir()
REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
COSINES = [0.6, 0.7, 0.8, 0.82, 0.9]
SCACHE_DEFAULT = ArmConfig(name="x").threshold
MULTI_VARIANTS = {
    "multi": MultiSimilarityConfig(),
    "multi-strict": MultiSimilarityConfig(lexical="word", token=0.3, phrase=0.6, intent=0.1,
                                          threshold=0.6, answer_margin=0.04),
}
GPTCACHE_DEFAULT_COSINE = 2 * 0.8 - 1


# -- scenarios ------------------------------------------------------------------------

def scenarios(banking_queries: int) -> list[dict]:
    mock = json.loads((DATA / "gptcache-mock" / "mock_data.json").read_text())
    test = pd.read_csv(DATA / "banking77" / "test.csv")
    train = pd.read_csv(DATA / "banking77" / "train.csv")
    unrelated = list(test.sample(len(mock), random_state=7).text)
    traffic = test.sample(banking_queries, random_state=0)
    return [
        {"name": "mock", "store": [[p["origin"], str(i)] for i, p in enumerate(mock)],
         "queries": [p["similar"] for p in mock] + unrelated,
         "expected": [str(i) for i in range(len(mock))] + [None] * len(unrelated)},
        {"name": "banking77", "store": [[t, c] for t, c in zip(train.text, train.category)],
         "queries": list(traffic.text), "expected": list(traffic.category)},
    ]


# -- scache side ----------------------------------------------------------------------

class WarmTable:
    """The real encoder, with the stored texts encoded up front in batches, so
    warming is quick while every lookup still pays one real encode."""

    def __init__(self, embedder, texts: list[str]):
        self.inner, self.dim = embedder, embedder.dim
        vecs, norms = embedder.encode_with_norms(texts)
        self.rows = {t: (vecs[i], norms[i]) for i, t in enumerate(texts)}

    def encode_with_norms(self, texts):
        if all(t in self.rows for t in texts):
            return (np.vstack([self.rows[t][0] for t in texts]),
                    np.array([self.rows[t][1] for t in texts], dtype=np.float32))
        return self.inner.encode_with_norms(texts)

    def encode(self, texts):
        return self.encode_with_norms(texts)[0]


def scan_cache(embedder, scenario: dict) -> SemanticCache:
    # Threshold -1: every lookup "hits" its best live candidate, so one pass yields
    # the decision at every threshold (hit iff similarity >= t, same candidate).
    arm = ArmConfig(name="scan", threshold=-1.0, ann_check_rate=0.0, index_kind="flat")
    exp = ExperimentConfig(experiment_id="bench", salt="bench", arms=[arm])
    cache = SemanticCache(WarmTable(embedder, [q for q, _ in scenario["store"]]),
                          ExperimentRegistry({"bench": exp}))
    for query, answer in scenario["store"]:
        cache.store(query, answer, unit_id="bench")
    return cache


def run_scache(backend: str, scenario: dict) -> dict:
    embedder = load_embedder(CacheSettings(encoder_backend=backend, encoder_threads=1))
    cache = scan_cache(embedder, scenario)
    for query in scenario["queries"][:10]:
        cache.lookup(query, unit_id="bench")
    sims, answers, latencies = [], [], []
    for query in scenario["queries"]:
        started = time.perf_counter()
        result = cache.lookup(query, unit_id="bench")
        latencies.append((time.perf_counter() - started) * 1000)
        sims.append(None if result.similarity is None else float(result.similarity))
        answers.append(result.answer)
    return {"similarity": sims, "answer": answers, "latency_ms": latencies}


def multi_cache(embedder, scenario: dict,
                multi: MultiSimilarityConfig) -> tuple[SemanticCache, dict[float, str]]:
    """One shared store; one multi-similarity arm per cosine threshold, and a unit per arm."""
    arms = [ArmConfig(name=f"multi-{t}", threshold=t, ann_check_rate=0.0, index_kind="flat",
                      similarity="multi", multi=multi) for t in COSINES]
    exp = ExperimentConfig(experiment_id="bench", salt="bench", partition_mode="shared", arms=arms)
    cache = SemanticCache(WarmTable(embedder, [q for q, _ in scenario["store"]]),
                          ExperimentRegistry({"bench": exp}))
    for query, answer in scenario["store"]:
        cache.store(query, answer, unit_id="bench")
    units = {}
    for i in range(100_000):
        arm = assign(exp, f"u{i}").arm
        units.setdefault(float(arm.split("-", 1)[1]), f"u{i}")
        if len(units) == len(COSINES):
            break
    return cache, units


def run_scache_multi(backend: str, scenario: dict,
                     multi: MultiSimilarityConfig) -> dict[float, dict]:
    """Per cosine threshold: the multi arm's real decisions (answer None on a miss)."""
    embedder = load_embedder(CacheSettings(encoder_backend=backend, encoder_threads=1))
    cache, units = multi_cache(embedder, scenario, multi)
    runs = {}
    for t, unit in units.items():
        sims, answers, latencies = [], [], []
        for query in scenario["queries"]:
            started = time.perf_counter()
            result = cache.lookup(query, unit_id=unit)
            latencies.append((time.perf_counter() - started) * 1000)
            sims.append(None if result.similarity is None else float(result.similarity))
            answers.append(result.answer)
        runs[t] = {"similarity": sims, "answer": answers, "latency_ms": latencies}
    return runs


# -- GPTCache side --------------------------------------------------------------------

def gptcache_python() -> str:
    out = subprocess.run(["bash", str(REPO / "bench" / "setup_gptcache.sh")], check=True,
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def run_gptcache(items: list[dict]) -> dict:
    plan = {"model_path": resolve_model_path(CacheSettings().model),
            "scenarios": [{k: s[k] for k in ("name", "store", "queries")} for s in items]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(plan, handle)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    try:
        out = subprocess.run([gptcache_python(), str(REPO / "bench" / "gptcache_side.py"), handle.name],
                             check=True, capture_output=True, text=True, env=env)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"GPTCache side failed:\n{exc.stderr[-3000:]}") from exc
    finally:
        os.unlink(handle.name)
    return json.loads(out.stdout)


# -- scoring --------------------------------------------------------------------------

def score(run: dict, expected: list, cosine: float) -> dict:
    """Hits / correct / false at one cosine threshold; unrelated queries counted apart."""
    counts = {"queries": 0, "hits": 0, "correct": 0, "false": 0, "unrelated": 0, "unrelated_hits": 0}
    for sim, answer, want in zip(run["similarity"], run["answer"], expected):
        hit = sim is not None and sim >= cosine - 1e-9 and answer is not None
        if want is None:
            counts["unrelated"] += 1
            counts["unrelated_hits"] += hit
            continue
        counts["queries"] += 1
        counts["hits"] += hit
        counts["correct"] += hit and answer == want
        counts["false"] += hit and answer != want
    counts["hit_rate"] = counts["hits"] / max(counts["queries"], 1)
    counts["false_hit_rate"] = counts["false"] / max(counts["hits"], 1)
    return counts


def latency(run: dict) -> dict:
    return {"p50_ms": float(np.percentile(run["latency_ms"], 50)),
            "p99_ms": float(np.percentile(run["latency_ms"], 99))}


def markdown(results: dict) -> str:
    lines = ["| scenario | system | cosine t (GPTCache t) | hits | correct | false | false/hits | "
             "unrelated hits | lookup p50 / p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for name, systems in results["scenarios"].items():
        for system, data in systems.items():
            lat = data["latency"]
            for row in data["thresholds"]:
                c = row["counts"]
                lines.append(
                    f"| {name} | {system} | {row['cosine']:.2f} ({(row['cosine'] + 1) / 2:.3f}) | "
                    f"{c['hits']}/{c['queries']} | {c['correct']} | {c['false']} | "
                    f"{c['false_hit_rate']:.3f} | {c['unrelated_hits']}/{c['unrelated']} | "
                    f"{lat['p50_ms']:.1f} / {lat['p99_ms']:.1f} |")
    return "\n".join(lines)


def defaults_line(results: dict) -> str:
    out = []
    for name, systems in results["scenarios"].items():
        g = score_at(systems["gptcache"], GPTCACHE_DEFAULT_COSINE)
        for system, data in systems.items():
            if system == "gptcache":
                continue
            s = score_at(data, SCACHE_DEFAULT)
            out.append(f"{name}: {system} at its default cosine {SCACHE_DEFAULT} -> correct {s['correct']}, "
                       f"false {s['false']}, unrelated hits {s['unrelated_hits']}; GPTCache at its "
                       f"default 0.8 (cosine 0.60) -> correct {g['correct']}, false {g['false']}, "
                       f"unrelated hits {g['unrelated_hits']}")
    return "\n".join(out)


def scenario_results(runs: dict, multi_runs: dict, expected: list) -> dict:
    out = {system: {"latency": latency(run),
                    "thresholds": [{"cosine": t, "counts": score(run, expected, t)} for t in COSINES],
                    **({"check_at_default": run["check"]} if "check" in run else {})}
           for system, run in runs.items()}
    for system, by_t in multi_runs.items():
        at_default = min(by_t, key=lambda t: abs(t - GPTCACHE_DEFAULT_COSINE))
        out[system] = {"latency": latency(by_t[at_default]),
                       "thresholds": [{"cosine": t, "counts": score(by_t[t], expected, t)}
                                      for t in COSINES]}
    return out


def odd_pairs(mock: dict) -> list[int]:
    """Mock rows held out from tuning: pairs with an odd index, and odd unrelated rows."""
    return [i for i in range(len(mock["queries"])) if i % 2 == 1]


def unique_origin_rows(mock: dict) -> list[int]:
    """Mock rows whose origin text is stored once, plus every unrelated row."""
    texts = [q for q, _ in mock["store"]]
    stored = Counter(texts)
    return [i for i, want in enumerate(mock["expected"])
            if want is None or stored[texts[int(want)]] == 1]


def subset(run: dict, rows: list[int]) -> dict:
    return {k: [v[i] for i in rows] for k, v in run.items() if isinstance(v, list)}


def goal_line(results: dict) -> str:
    """The issue's goal at GPTCache's default (cosine 0.60): at least as many correct
    hits as GPTCache with at most half its false hits."""
    out = []
    for name, systems in results["scenarios"].items():
        g = score_at(systems["gptcache"], GPTCACHE_DEFAULT_COSINE)
        for system, data in systems.items():
            if "-multi" not in system:
                continue
            m = score_at(data, GPTCACHE_DEFAULT_COSINE)
            met = m["correct"] >= g["correct"] and m["false"] <= g["false"] / 2
            out.append(f"{name}: {system} at cosine 0.60 -> correct {m['correct']} (GPTCache "
                       f"{g['correct']}), false {m['false']} (GPTCache {g['false']}, half "
                       f"{g['false'] / 2:g}); goal {'met' if met else 'NOT met'}")
    return "\n".join(out)


def score_at(data: dict, cosine: float) -> dict:
    return next(r["counts"] for r in data["thresholds"] if abs(r["cosine"] - cosine) < 1e-9)


# -- threshold curves -----------------------------------------------------------------

def pair_sets() -> dict[str, tuple[list[str], list[str], np.ndarray]]:
    rows = [l.rstrip("\n").split("\t") for l in open(DATA / "stsb" / "sts-test.csv", encoding="utf-8")]
    rows = [r for r in rows if len(r) >= 7]
    mrpc = [l.rstrip("\n").split("\t") for l in
            open(DATA / "mrpc" / "msr_paraphrase_test.txt", encoding="utf-8-sig")][1:]
    mrpc = [r for r in mrpc if len(r) >= 5]
    return {"STS-B test (score >= 4)": ([r[5] for r in rows], [r[6] for r in rows],
                                        np.array([float(r[4]) >= 4.0 for r in rows])),
            "MRPC test": ([r[3] for r in mrpc], [r[4] for r in mrpc],
                          np.array([r[0] == "1" for r in mrpc]))}


def pair_curves(embedder, grid: np.ndarray) -> dict:
    curves = {}
    for name, (left, right, positive) in pair_sets().items():
        sims = np.sum(embedder.encode(left) * embedder.encode(right), axis=1)
        prec, rec = [], []
        for t in grid:
            said = sims >= t
            prec.append(float((said & positive).sum() / max(said.sum(), 1)))
            rec.append(float((said & positive).sum() / max(positive.sum(), 1)))
        curves[name] = {"precision": prec, "recall": rec}
    return curves


def cache_curve(run: dict, expected: list, grid: np.ndarray) -> dict:
    prec, rec = [], []
    for t in grid:
        c = score(run, expected, float(t))
        prec.append(c["correct"] / max(c["hits"], 1))
        rec.append(c["correct"] / max(c["queries"], 1))
    return {"precision": prec, "recall": rec}


def plot(grid: np.ndarray, curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (title, group) in zip(axes, curves.items()):
        for i, (name, curve) in enumerate(group.items()):
            color = f"C{i}"
            style = "--" if "gptcache" in name else "-"
            ax.plot(grid, curve["precision"], style, color=color, label=f"{name} precision")
            ax.plot(grid, curve["recall"], ":", color=color, label=f"{name} recall")
        ax.axvline(SCACHE_DEFAULT, color="grey", lw=0.8)
        ax.axvline(GPTCACHE_DEFAULT_COSINE, color="grey", lw=0.8, ls="--")
        ax.set_title(title)
        ax.set_xlabel("cosine threshold (GPTCache t = (cos + 1) / 2)")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="lower left")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_frontier(results: dict, cosine_runs: dict, grid: np.ndarray, path: Path) -> None:
    """Correct vs false hits: GPTCache's cosine sweep as a line, each multi arm as points
    (one per cosine threshold); the goal region is shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cosine_runs), figsize=(6 * len(cosine_runs), 4.5))
    for ax, (name, (run, expected)) in zip(np.atleast_1d(axes), cosine_runs.items()):
        sweep = [score(run, expected, float(t)) for t in grid]
        ax.plot([c["false"] for c in sweep], [c["correct"] for c in sweep], "--", color="C0",
                label="GPTCache / cosine, threshold swept")
        g = score_at(results["scenarios"][name]["gptcache"], GPTCACHE_DEFAULT_COSINE)
        ax.fill_between([0, g["false"] / 2], g["correct"], g["correct"] * 1.05, color="C2", alpha=0.15,
                        label="goal: >= correct, <= half the false hits")
        ax.plot([g["false"]], [g["correct"]], "o", color="C0", label="GPTCache default 0.8 (cos 0.60)")
        shown = set()  # one backend per variant: the backends' decisions coincide (see the table)
        for i, (system, data) in enumerate(results["scenarios"][name].items()):
            variant = system.split("-", 2)[-1]
            if "-multi" not in system or variant in shown:
                continue
            shown.add(variant)
            pts = [(r["counts"]["false"], r["counts"]["correct"], r["cosine"]) for r in data["thresholds"]]
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], "s-", color=f"C{i + 1}", label=system)
            for x, y, t in pts:
                ax.annotate(f"{t:.2f}", (x, y), fontsize=7, xytext=(3, -9), textcoords="offset points")
        ax.set_title(f"{name}: correct vs false hits")
        ax.set_xlabel("false hits")
        ax.set_ylabel("correct hits")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- main -----------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--banking-queries", type=int, default=1000)
    parser.add_argument("--backends", nargs="+", default=["torch", "onnx"],
                        choices=["torch", "onnx", "onnx-int8"])
    args = parser.parse_args()
    set_search_threads(1)
    items = scenarios(args.banking_queries)
    print("GPTCache side (subprocess) ...", flush=True)
    gpt = run_gptcache(items)
    runs = {s["name"]: {"gptcache": gpt["scenarios"][s["name"]]} for s in items}
    multi_runs = {s["name"]: {} for s in items}
    for backend in args.backends:
        for s in items:
            print(f"scache ({backend}) on {s['name']} ...", flush=True)
            runs[s["name"]][f"scache-{backend}"] = run_scache(backend, s)
        for s in items:
            for variant, multi in MULTI_VARIANTS.items():
                print(f"scache ({backend}, {variant} similarity) on {s['name']} ...", flush=True)
                multi_runs[s["name"]][f"scache-{backend}-{variant}"] = run_scache_multi(backend, s, multi)
    results = {"gptcache_version": gpt["gptcache_version"], "scenarios": {}}
    for s in items:
        results["scenarios"][s["name"]] = scenario_results(runs[s["name"]], multi_runs[s["name"]],
                                                           s["expected"])
    mock = next(s for s in items if s["name"] == "mock")
    odd, unique = odd_pairs(mock), unique_origin_rows(mock)
    for name, rows in [("mock-odd", odd), ("mock-unique", unique),
                       ("mock-odd-unique", sorted(set(odd) & set(unique)))]:
        results["scenarios"][name] = scenario_results(
            {k: subset(r, rows) for k, r in runs["mock"].items()},
            {k: {t: subset(r, rows) for t, r in by_t.items()} for k, by_t in multi_runs["mock"].items()},
            [mock["expected"][i] for i in rows])
    grid = np.round(np.arange(0.3, 0.991, 0.01), 2)
    banking = next(s for s in items if s["name"] == "banking77")
    curves = {"banking77 test vs train cache (correct-hit precision / recall)":
              {system: cache_curve(run, banking["expected"], grid)
               for system, run in runs["banking77"].items()},
              "labelled pairs, scache encoder (pair precision / recall)":
              pair_curves(load_embedder(CacheSettings(encoder_threads=1)), grid)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(grid, curves, RESULTS / "threshold_curves.png")
    plot_frontier(results, {"banking77": (runs["banking77"]["gptcache"], banking["expected"]),
                            "mock-unique": (subset(runs["mock"]["gptcache"], unique),
                                            [mock["expected"][i] for i in unique])},
                  grid, RESULTS / "correct_vs_false.png")
    table = markdown(results)
    summary = defaults_line(results) + "\n\n" + goal_line(results)
    (RESULTS / "compare_gptcache.json").write_text(json.dumps(results, indent=1, default=float))
    (RESULTS / "compare_gptcache.md").write_text(
        f"# scache vs GPTCache {results['gptcache_version']}\n\n"
        f"Matched cosine thresholds; GPTCache's own t in parentheses.\n\n{table}\n\n{summary}\n")
    print(table)
    print(summary)
    for name, systems in results["scenarios"].items():
        if "check_at_default" not in systems["gptcache"]:
            continue
        print(f"{name}: GPTCache real get() at 0.8 agrees with the derived decision on "
              f"{systems['gptcache']['check_at_default']['agree']}/"
              f"{systems['gptcache']['check_at_default']['queries']} queries")
    print(f"written {RESULTS}/compare_gptcache.md, .json, threshold_curves.png")


if __name__ == "__main__":
    main()
