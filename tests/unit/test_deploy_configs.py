"""The deployment files (infra/deploy: docker-compose.yml, the Dockerfiles, k8s/) against the
code they run. No container engine or cluster is here, so this checks what can be checked
without one: names, modules, files, probes, arguments and versions that drift silently."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cache_core.settings import Settings, reference
from infra.flink.resolve import connector_version
from infra.runtime import REPO_ROOT

DEPLOY = REPO_ROOT / "infra" / "deploy"
K8S = DEPLOY / "k8s"
IMAGE_ROOT = "/opt/scache"  # WORKDIR of the Dockerfile, where the repo's folders are copied
SETTINGS = {row.env for row in reference(Settings())}


def _docs(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def k8s_objects() -> list[dict]:
    return [doc for path in sorted(K8S.rglob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in _docs(path)]


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def containers(obj: dict) -> list[dict]:
    """Every container spec in a k8s object, however deeply its pod template sits."""
    found = []

    def walk(node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("containers", "initContainers") and isinstance(value, list):
                    found.extend(c for c in value if isinstance(c, dict))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(obj)
    return found


def scache_names_set() -> dict[str, set[str]]:
    """Every SCACHE_* variable the deployment files set, by where it is set."""
    names: dict[str, set[str]] = {}
    for obj in k8s_objects():
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "ConfigMap":
            names[where] = set(obj.get("data", {}))
        for container in containers(obj):
            names.setdefault(where, set()).update(e["name"] for e in container.get("env", []))
    for name, service in compose()["services"].items():
        names[f"compose/{name}"] = set(service.get("environment") or {})
    names["compose/x-scache-env"] = set(compose()["x-scache-env"])
    return {where: {n for n in found if n.startswith("SCACHE_")} for where, found in names.items()}


def commands() -> list[tuple[str, list[str]]]:
    out = []
    for obj in k8s_objects():
        for container in containers(obj):
            if container.get("command"):
                out.append((f"{obj['kind']}/{obj['metadata']['name']}", container["command"]))
    for name, service in compose()["services"].items():
        command = service.get("command")
        if isinstance(command, list):
            out.append((f"compose/{name}", command))
    return out


def test_every_scache_variable_set_is_a_setting():
    unknown = {where: sorted(names - SETTINGS) for where, names in scache_names_set().items() if names - SETTINGS}
    assert not unknown, f"not settings (renamed or misspelt?): {unknown}"
    assert sum(len(names) for names in scache_names_set().values()) > 20  # the walk found them


def test_every_module_and_file_they_run_exists():
    seen = 0
    for where, command in commands():
        if command[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(command[2]) is not None, f"{where}: no module {command[2]}"
            seen += 1
        for arg in command:
            if arg.endswith(".py"):  # a path in the image or relative to its WORKDIR
                relative = arg.removeprefix(IMAGE_ROOT + "/")
                assert (REPO_ROOT / relative).is_file(), f"{where}: no file {arg}"
    assert seen >= 8


def test_cache_probes_are_the_services_routes_and_its_port_is_the_setting():
    from cache_core.service.routes import ROUTERS

    get_paths = {route.path for router in ROUTERS for route in router.routes if "GET" in route.methods}
    (cache,) = [o for o in k8s_objects() if o["kind"] == "StatefulSet"]
    (container,) = containers(cache)
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        path = container[probe]["httpGet"]["path"]
        assert path in get_paths, f"{probe} {path} is not a GET route of the cache service"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (config,) = [o for o in k8s_objects() if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "scache-config"]
    assert [p["containerPort"] for p in container["ports"]] == [int(config["data"]["SCACHE_SERVICE__PORT"])]
    assert "$(POD_NAME)" in container["command"]  # a stable instance id per replica
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(Path(config["data"]["SCACHE_CACHE__SNAPSHOT_DIR"]).parent) in mounts  # snapshots on the volume
    assert str(Path(config["data"]["SCACHE_EXPERIMENTS_FILE"]).parent) in mounts


def test_flink_submissions_ship_no_pyfs_and_name_the_images_jars():
    """The job adds udfs/, cache_core/ and jobs/ itself; -pyfs with the same folders fails the
    client (infra/flink/README.md). Jar versions must be the image's."""
    flink_image = (DEPLOY / "flink.Dockerfile").read_text()
    flink_version = re.search(r"^FROM flink:(\d+\.\d+\.\d+)", flink_image, re.M).group(1)
    connector = connector_version()
    assert "opt/flink-python-*.jar /opt/flink/lib/" in flink_image  # Python jobs need it on the classpath
    submit = compose()["services"]["submit-job"]["command"]
    (deployment,) = [o for o in k8s_objects() if o["kind"] == "FlinkDeployment"]
    args = deployment["spec"]["job"]["args"]
    for text in (submit, " ".join(args)):
        assert "-pyfs" not in text and "-py /opt/scache/jobs/attribution_job.py" in text
    assert deployment["spec"]["job"]["jarURI"] == f"local:///opt/flink/opt/flink-python-{flink_version}.jar"
    assert deployment["spec"]["flinkVersion"] == "v" + "_".join(flink_version.split(".")[:2])
    jar = f"flink-sql-connector-kafka-{connector}.jar"
    (flink_config,) = [o for o in k8s_objects() if o["metadata"]["name"] == "scache-flink-config"]
    for where in (submit, compose()["services"]["submit-job"]["environment"]["SCACHE_FLINK__CONNECTOR_JAR"],
                  flink_config["data"]["SCACHE_FLINK__CONNECTOR_JAR"]):
        assert jar in where


def test_kafka_cluster_matches_what_the_failover_tests_measured():
    (kafka,) = [o for o in k8s_objects() if o["kind"] == "Kafka"]
    config = kafka["spec"]["kafka"]["config"]
    assert config["min.insync.replicas"] == 2 and config["default.replication.factor"] == 3
    assert config["broker.session.timeout.ms"] == 4000 and config["auto.create.topics.enable"] is False
    assert compose()["x-kafka"]["environment"]["KAFKA_BROKER_SESSION_TIMEOUT_MS"] == 4000
    (pool,) = [o for o in k8s_objects() if o["kind"] == "KafkaNodePool"]
    assert pool["spec"]["replicas"] == 3 and set(pool["spec"]["roles"]) == {"broker", "controller"}


def test_every_manifest_is_listed_in_its_kustomization():
    for folder in (K8S, K8S / "platform"):
        listed = set(yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"])
        present = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
        assert listed == present, folder


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
@pytest.mark.parametrize("folder", [K8S, K8S / "platform"], ids=["scache", "platform"])
def test_kustomize_renders_each_folder(folder):
    run = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(run.stdout) if doc]
    assert len(kinds) == sum(len(_docs(p)) for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")


def test_no_image_step_hides_its_failure():
    """A build step that fails (the ONNX export above all) fails the image build: no ``|| true``."""
    for dockerfile in sorted(DEPLOY.glob("*Dockerfile")):
        for number, line in enumerate(dockerfile.read_text().splitlines(), 1):
            if not line.lstrip().startswith("#"):
                assert "|| true" not in line, f"{dockerfile.name}:{number}: {line.strip()}"


def dockerfile_stages(path: Path) -> dict[str, tuple[str, list[str]]]:
    """stage name -> (its FROM image, its instructions with continuation lines joined)."""
    stages: dict[str, tuple[str, list[str]]] = {}
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        found = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?$", line, re.I)
        if found:
            current = found.group(2) or f"stage{len(stages)}"
            stages[current] = (found.group(1), [])
        else:
            stages[current][1].append(line)
    return stages


def test_the_image_exports_in_a_builder_stage_and_runs_without_torch():
    """The multi-stage Dockerfile, read statically (no container engine here): the export extra and
    the ONNX export live in the builder only; the runtime stage installs the package with no extra,
    refuses torch, copies the int8 export (and the fp32 one the judge reads) to the models directory its settings name, outside any
    state volume; the default (last) stage is that runtime."""
    from cache_core.embedding.onnx import onnx_export_dir
    from cache_core.settings import CacheSettings

    stages = dockerfile_stages(DEPLOY / "Dockerfile")
    assert list(stages) == ["builder", "runtime", "dashboard", "cache"]
    builder = "\n".join(stages["builder"][1])
    assert "pip install -c requirements.lock '.[export]'" in builder
    assert "python -m cache_core.embedding.export --backend onnx-int8 --models-dir /models" in builder
    assert importlib.util.find_spec("cache_core.embedding.export") is not None

    base, runtime = stages["runtime"]
    assert base == stages["builder"][0]  # a fresh base: nothing of the builder but what is copied
    installs = [line for line in runtime if "pip install" in line]
    assert installs and all("pip install -c requirements.lock . " in line + " " for line in installs), installs
    assert not any(word in line for line in runtime for word in ("[export]", "-r requirements.lock", "torch==")), runtime
    assert any('import torch' in line and "exit 1" in line for line in runtime)  # refused if it crept in
    env = dict(re.findall(r"(SCACHE_\w+)=(\S+)", " ".join(line for line in runtime if line.startswith("ENV"))))
    assert set(env) - {"SCACHE_HOME"} <= SETTINGS and env["SCACHE_CACHE__ENCODER_BACKEND"] == "onnx-int8"
    # the image serves with the arms `scache serve` uses, never the demo's showcase (an arm at cosine 0.80)
    assert env["SCACHE_EXPERIMENTS_FILE"] == "/opt/scache/infra/serve-experiments.yaml"
    assert any(line.startswith("COPY infra ./infra") for line in runtime) and (DEPLOY.parent / "serve-experiments.yaml").is_file()
    models_dir = env["SCACHE_CACHE__MODELS_DIR"]
    exports = [onnx_export_dir(CacheSettings().model, quantized=q, models_dir=Path(models_dir)) for q in (True, False)]
    copies = [line for line in runtime if line.startswith("COPY --from=")]
    # int8 for the encoder, fp32 for the judge's token pass (cache_core/decision/judge_tokens.py)
    assert copies == [f"COPY --from=builder /models/{e.name} {e}" for e in exports]
    assert any("load_embedder(CacheSettings())" in line for line in runtime if line.startswith("RUN"))

    # The export is not under a state volume, where an empty mounted volume would hide it.
    mounts = {m["mountPath"] for o in k8s_objects() for c in containers(o) for m in c.get("volumeMounts", [])}
    mounts |= {v.split(":")[1] for s in compose()["services"].values() for v in s.get("volumes", [])}
    assert mounts and not any(models_dir.startswith(m.rstrip("/") + "/") or models_dir == m for m in mounts)

    assert stages["dashboard"][0] == "runtime"
    assert "RUN pip install -c requirements.lock '.[dashboard]'" in stages["dashboard"][1]
    assert stages["cache"] == ("runtime", [])
    for name in ("dashboard", "autotune"):
        assert compose()["services"][name]["image"] == "scache-dashboard:latest"
    images = {c["image"] for o in k8s_objects() for c in containers(o) if c.get("image", "").startswith("scache")}
    listed = {i["name"] for i in yaml.safe_load((K8S / "kustomization.yaml").read_text())["images"]}
    assert images == listed == {"scache", "scache-dashboard"}


def test_the_runtime_dependencies_hold_no_torch():
    """``pip install .`` (the runtime stage) pulls none of the export extra's packages."""
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[=<>\[ ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    export = {re.split(r"[=<>\[ ]", dep, maxsplit=1)[0].lower() for dep in project["optional-dependencies"]["export"]}
    assert {"torch", "sentence-transformers", "onnx"} <= export and not names & export
    assert {"onnxruntime", "tokenizers"} <= names
