"""``python -m cache_core.embedding.export``: make the encoder's ONNX export now instead of at the
first start (infra/setup.sh and the Dockerfile's builder stage run it). Prints the directory and
how the export agrees with its source; exits non-zero if it cannot be made or disagrees (an export
whose probe vectors fall below cosine 0.95 of the source's is refused, not cached)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cache_core.embedding.embedder import EmbedderError
from cache_core.embedding.onnx import META_FILE, can_export, ensure_onnx_export
from cache_core.settings import CacheSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cache_core.embedding.export",
        description="Export the encoder to ONNX once (needs the export extra: torch, sentence-transformers, onnx).")
    parser.add_argument("--model", default=CacheSettings.model_fields["model"].default,
                        help="weights: a package, directory or local model name (default %(default)s)")
    parser.add_argument("--backend", choices=["onnx", "onnx-int8"], default="onnx-int8",
                        help="fp32 or int8 (int8 also writes the fp32 export it is quantised from)")
    parser.add_argument("--models-dir", type=Path,
                        help="where the export goes (default: SCACHE_CACHE__MODELS_DIR, else $SCACHE_HOME/models)")
    args = parser.parse_args(argv)
    if not can_export():
        parser.error("the export extra is not installed (pip install 'scache[export]')")
    try:
        models_dir = args.models_dir or CacheSettings().models_dir
        directory = ensure_onnx_export(args.model, args.backend == "onnx-int8", models_dir)
    except EmbedderError as exc:
        print(f"python -m cache_core.embedding.export: {exc}", file=sys.stderr)
        return 1
    report = json.loads((directory / META_FILE).read_text()).get("report", {})
    print(f"{args.backend} export of {args.model}: {json.dumps(report)}", file=sys.stderr)
    print(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
