"""GPTCache's own HTTP server (``gptcache_server.server``'s FastAPI app, ``POST /get``) for
bench/front_throughput.py; runs in GPTCache's venv (bench/setup_gptcache.sh).

    venv-gptcache/bin/python bench/gptcache_server_side.py PORT STORE.json MODEL_PATH [VECTORS.npy]

Set up as bench/gptcache_side.py does (its README's similar search: SBERT on the same MiniLM
weights as scache, sqlite + FAISS, ``SearchDistanceEvaluation``, threshold 0.8 = cosine 0.6), with
STORE's ``[[question, answer], ...]`` imported, then served by uvicorn like its own ``main``. With
VECTORS (the stored questions' vectors from scache's encoder, same weights) the import skips GPTCache's
own encode of every stored question, minutes of torch on a loaded machine; queries are always
encoded by GPTCache's SBERT."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import uvicorn
from gptcache import Config, cache
from gptcache.embedding import SBERT
from gptcache.manager import CacheBase, VectorBase, get_data_manager
from gptcache.processor.pre import get_prompt
from gptcache.similarity_evaluation.distance import SearchDistanceEvaluation
from gptcache_server.server import app


def main() -> None:
    port, store, model_path = int(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()), sys.argv[3]
    encoder = SBERT(model_path)
    with tempfile.TemporaryDirectory(prefix="gptcache-server-") as tmp:
        manager = get_data_manager(
            CacheBase("sqlite", sql_url=f"sqlite:///{tmp}/sqlite.db"),
            VectorBase("faiss", dimension=encoder.dimension, index_path=f"{tmp}/faiss.index"),
            max_size=max(1000, 2 * len(store)))
        cache.init(pre_embedding_func=get_prompt, embedding_func=encoder.to_embeddings, data_manager=manager,
                   similarity_evaluation=SearchDistanceEvaluation(), config=Config(similarity_threshold=0.8))
        questions = [q for q, _ in store]
        if len(sys.argv) > 4:
            vectors = np.load(sys.argv[4]).astype("float32")
        else:
            vectors = encoder.model.encode(questions, batch_size=64, convert_to_numpy=True).astype("float32")
        manager.import_data(questions, [a for _, a in store], list(vectors), [None] * len(store))
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
