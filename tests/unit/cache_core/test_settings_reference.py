"""cache_core.settings' reference listing: every variable, masked secrets, docs/settings.md in sync."""
from cache_core import settings as settings_module
from cache_core.settings import PROJECT_ROOT, Settings, reference


def _clean_env(monkeypatch):
    import os
    for name in [n for n in os.environ if n.startswith("SCACHE_")]:
        monkeypatch.delenv(name)


def test_every_leaf_setting_is_listed_with_its_env_name(monkeypatch):
    _clean_env(monkeypatch)
    rows = {r.env: r for r in reference(Settings())}
    assert rows["SCACHE_KAFKA__BOOTSTRAP_SERVERS"].default == "127.0.0.1:9092"
    assert rows["SCACHE_CACHE__ANN_CHECK_BATCH_SIZE"].description.startswith("Sampled ANN-vs-exact checks")
    assert rows["SCACHE_CACHE__SNAPSHOT_DIR"].default == "~/.cache/scache/snapshots"
    assert rows["SCACHE_EXPERIMENTS_FILE"].default == "<repo>/infra/serve-experiments.yaml"
    groups = ["KAFKA", "CLICKHOUSE", "CACHE", "SERVICE", "FLINK", "DASHBOARD", "SHADOW", "TRACING"]
    leaves = sum(len(type(getattr(Settings(), g.lower())).model_fields) for g in groups)
    assert len(rows) == leaves + len(Settings.model_fields) - len(groups)


def test_values_in_effect_and_masked_secrets(monkeypatch, capsys):
    _clean_env(monkeypatch)
    monkeypatch.setenv("SCACHE_SERVICE__PORT", "9001")
    monkeypatch.setenv("SCACHE_DASHBOARD__ADMIN_TOKEN", "hunter2")
    assert settings_module.main([]) == 0
    out = capsys.readouterr().out
    assert "SCACHE_SERVICE__PORT=8000   # set here: 9001" in out
    assert "SCACHE_DASHBOARD__ADMIN_TOKEN=   # set here: ***" in out and "hunter2" not in out


def test_a_bad_value_is_a_message_not_a_traceback(monkeypatch, capsys):
    _clean_env(monkeypatch)
    monkeypatch.setenv("SCACHE_SERVICE__PORT", "eighty")
    assert settings_module.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("settings: SCACHE_SERVICE__PORT='eighty': Input should be a valid integer"), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err  # one line naming the variable


def test_docs_settings_md_is_the_generated_table(monkeypatch, capsys):
    _clean_env(monkeypatch)
    assert settings_module.main(["--markdown"]) == 0
    table = capsys.readouterr().out.strip()
    doc = (PROJECT_ROOT / "docs" / "settings.md").read_text()
    assert table in doc, "docs/settings.md is stale: regenerate it with python -m cache_core.settings --markdown"
