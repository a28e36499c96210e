"""Every command line with bad input: unknown flags, bad values, missing/unreadable/garbage files,
bad URLs, a refused loopback port, bad SCACHE_* values. Each must exit non-zero with its reason on
one line of stderr and no traceback. Nothing real is started: every service address points at a
refused loopback port and every state directory is under tmp_path (so a regression that starts
something touches nothing shared)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from infra.runtime import REPO_ROOT, free_port

REFUSED = free_port()  # nothing listens there: connecting is refused at once

GARBAGE = b"garbage\x00\xff{\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    made = {"dir": root / "a-directory", "garbage": root / "garbage.jsonl", "notjson": root / "notjson.jsonl",
            "ok": root / "ok.jsonl", "noanswer": root / "noanswer.csv",
            "question": root / "question.csv", "list": root / "list.yaml",
            "broken": root / "broken.yaml", "infweight": root / "inf.yaml", "badcols": root / "badcols",
            "b77garbage": root / "b77garbage", "b77ok": root / "b77ok", "npy": root / "npy"}
    made["dir"].mkdir()
    made["garbage"].write_bytes(GARBAGE)
    made["notjson"].write_text('{"query": "q", "answer": "a"}\nnot json\n')
    made["ok"].write_text('{"query": "q", "answer": "a"}\n')
    made["noanswer"].write_text('query,answer\n"a question",\n')
    made["question"].write_text('question,answer\n"a question",a\n')
    made["list"].write_text("- a\n- b\n")
    made["broken"].write_text("experiments: [\n")
    made["infweight"].write_text("experiments:\n  - {experiment_id: x, salt: s, arms: [{name: a, weight: .inf}]}\n")
    for name, train in (("badcols", "a,b\n1,2\n"), ("b77ok", "text,category\nhi,a\nhello,b\n")):
        made[name].mkdir()
        for split in ("train", "test"):
            (made[name] / f"{split}.csv").write_text(train)
    made["b77garbage"].mkdir()
    for split in ("train", "test"):
        (made["b77garbage"] / f"{split}.csv").write_bytes(GARBAGE)
    made["npy"].mkdir()
    (made["npy"] / "train.npy").write_bytes(b"not an npy file")
    return made


def _env(tmp_path, extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCACHE_")}
    env.update(SCACHE_HOME=str(tmp_path / "home"), SCACHE_KAFKA__BOOTSTRAP_SERVERS=f"127.0.0.1:{REFUSED}",
               SCACHE_CLICKHOUSE__URL=f"http://127.0.0.1:{REFUSED}", SCACHE_SERVICE__PORT=str(free_port()),
               SCACHE_CACHE__SNAPSHOT_DIR=str(tmp_path / "snapshots"), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


F = "@file:%s"  # an argument naming one of the files fixture's paths, e.g. F % "garbage"

# (case id, module, arguments, SCACHE_* / other env, exit status, text on one stderr line)
CASES = [
    ("settings unknown flag", "cache_core.settings", ["--bogus"], {}, 2, "unrecognized arguments: --bogus"),
    ("settings negative count", "cache_core.settings", [], {"SCACHE_CACHE__MAX_QUERY_CHARS": "-1"}, 2,
     "settings: SCACHE_CACHE__MAX_QUERY_CHARS='-1': Input should be greater than or equal to 1"),
    ("settings not a number", "cache_core.settings", [], {"SCACHE_KAFKA__EVENTS_PARTITIONS": "x"}, 2,
     "SCACHE_KAFKA__EVENTS_PARTITIONS='x': Input should be a valid integer"),
    ("settings unknown environment", "cache_core.settings", [], {"SCACHE_ENVIRONMENT": "prod"}, 2,
     "SCACHE_ENVIRONMENT='prod'"),
    ("settings tokens outside local", "cache_core.settings", [], {"SCACHE_ENVIRONMENT": "staging"}, 2,
     "SCACHE_SERVICE__ADMIN_TOKEN and SCACHE_DASHBOARD__ADMIN_TOKEN must be set"),
    ("settings refresh beyond retention", "cache_core.settings", [], {"SCACHE_CACHE__CLUSTER_REFRESH_S": "1e12"}, 2,
     "must be below the entries topic's retention"),
    ("settings infinite ttl", "cache_core.settings", [], {"SCACHE_CACHE__DEFAULT_TTL_S": "inf"}, 2,
     "SCACHE_CACHE__DEFAULT_TTL_S='inf': Input should be a finite number"),
    ("settings nan cost", "cache_core.settings", [], {"SCACHE_DASHBOARD__COST_PER_CALL_USD": "nan"}, 2,
     "SCACHE_DASHBOARD__COST_PER_CALL_USD='nan': Input should be a finite number"),
    ("settings tiny publish queue", "cache_core.settings", [], {"SCACHE_SERVICE__PUBLISH_QUEUE_SIZE": "10"}, 2,
     "SCACHE_SERVICE__PUBLISH_QUEUE_SIZE='10': Input should be greater than or equal to 100"),
    ("settings not a boolean", "cache_core.settings", [], {"SCACHE_CACHE__PERSIST": "maybe"}, 2,
     "SCACHE_CACHE__PERSIST='maybe': Input should be a valid boolean"),
    ("settings group not JSON", "cache_core.settings", [], {"SCACHE_KAFKA": '{"x":'}, 2, 'field "kafka"'),
    ("seed no file", "cache_core.seed", [], {}, 2, "the following arguments are required: file"),
    ("seed missing file", "cache_core.seed", ["/nonexistent/seed.jsonl"], {}, 2, "no such file"),
    ("seed directory", "cache_core.seed", [F % "dir"], {}, 2, "cannot read it (Is a directory)"),
    ("seed not utf-8", "cache_core.seed", [F % "garbage"], {}, 2, "not UTF-8 text"),
    ("seed not json", "cache_core.seed", [F % "notjson"], {}, 2, ":2: not JSON"),
    ("seed csv without answer", "cache_core.seed", [F % "noanswer"], {}, 2, ":2: answer must be a non-empty string"),
    ("seed batch zero", "cache_core.seed", [F % "ok", "--batch", "0"], {}, 2, "--batch must be 1-512"),
    ("seed batch not a number", "cache_core.seed", [F % "ok", "--batch", "x"], {}, 2, "invalid int value: 'x'"),
    ("seed negative skip", "cache_core.seed", [F % "ok", "--skip", "-1"], {}, 2, "--skip >= 0"),
    ("seed unparsable url", "cache_core.seed", [F % "ok", "--url", "http://[::1"], {}, 2, "--url 'http://[::1'"),
    ("seed url not http", "cache_core.seed", [F % "ok", "--url", "ftp://x"], {}, 1, "unsupported protocol"),
    ("seed refused port", "cache_core.seed", [F % "ok", "--url", f"http://127.0.0.1:{REFUSED}"], {}, 1,
     "the cache did not answer"),
    ("seed bad port setting", "cache_core.seed", [F % "ok"], {"SCACHE_SERVICE__PORT": "abc"}, 2,
     "seed: invalid settings: SCACHE_SERVICE__PORT='abc'"),
    ("service unknown flag", "cache_core.service", ["--bogus"], {}, 2, "unrecognized arguments: --bogus"),
    ("service bad port setting", "cache_core.service", [], {"SCACHE_SERVICE__PORT": "abc"}, 2,
     "cache_core.service: invalid settings: SCACHE_SERVICE__PORT='abc'"),
    ("service missing experiments", "cache_core.service", [], {"SCACHE_EXPERIMENTS_FILE": "/nonexistent.yaml"}, 2,
     "cannot start: experiments file not found"),
    ("service experiments directory", "cache_core.service", [], {"SCACHE_EXPERIMENTS_FILE": F % "dir"}, 2,
     "cannot read experiments file"),
    ("service experiments not utf-8", "cache_core.service", [], {"SCACHE_EXPERIMENTS_FILE": F % "garbage"}, 2,
     "is not UTF-8 text"),
    ("service experiments a list", "cache_core.service", [], {"SCACHE_EXPERIMENTS_FILE": F % "list"}, 2,
     "must hold a mapping with a list under 'experiments:'"),
    ("service experiments broken yaml", "cache_core.service", [], {"SCACHE_EXPERIMENTS_FILE": F % "broken"}, 2,
     "is not valid YAML"),
    ("service experiment infinite weight", "cache_core.service", [], {"SCACHE_EXPERIMENTS_FILE": F % "infweight"}, 2,
     "arms.0.weight: Input should be a finite number"),
    ("judge_eval no pairs", "cache_core.decision.judge_eval", ["--version", "v1"], {}, 2,
     "the following arguments are required: --pairs"),
    ("judge_eval unknown version", "cache_core.decision.judge_eval", ["--pairs", F % "ok", "--version", "nope"], {}, 2,
     "judge-nope.json does not exist"),
    ("judge_eval version is a path", "cache_core.decision.judge_eval", ["--pairs", F % "ok", "--version", "../x"],
     {}, 2, "judge_eval: "),
    ("judge_eval floor not a cosine", "cache_core.decision.judge_eval",
     ["--pairs", F % "ok", "--version", "v1", "--floor", "2"], {}, 2, "--floor is a cosine, within -1 and 1; got 2.0"),
    ("judge_user_path too few pairs", "bench.judge_user_path", ["--own-pairs", "10"], {}, 2,
     "--own-pairs must be at least 50, got 10"),
    ("judge_user_path unknown set", "bench.judge_user_path", ["--sets", "quora"], {}, 2, "invalid choice: 'quora'"),
    ("encoder_distill no epochs", "bench.encoder_distill", ["--epochs", "0"], {}, 2, "--epochs must be at least 1"),
    ("encoder_distill no teacher", "bench.encoder_distill", ["--teacher", "/nonexistent"], {}, 2,
     "no sentence-transformers model in /nonexistent"),
    ("guard_eval threshold not a number", "bench.guard_eval", ["--threshold", "abc"], {}, 2, "invalid float value"),
    ("guard_eval threshold nan", "bench.guard_eval", ["--threshold", "nan"], {}, 2, "--threshold must be in [-1, 1]"),
    ("guard_eval missing data", "bench.guard_eval", ["--data", "/nonexistent"], {}, 2, "banking77 not found"),
    ("guard_eval wrong columns", "bench.guard_eval", ["--data", F % "badcols"], {}, 2, "needs columns text and category"),
    ("guard_eval data not utf-8", "bench.guard_eval", ["--data", F % "b77garbage"], {}, 2, "banking77 unreadable"),
    ("guard_eval garbage embeddings cache", "bench.guard_eval",
     ["--data", F % "b77ok", "--embeddings-cache", F % "npy"], {}, 2, "embeddings cache"),
    ("autotune unknown flag", "dashboard.control.autotune", ["--once", "--bogus"], {}, 2, "unrecognized arguments"),
    ("autotune no schedule", "dashboard.control.autotune", [], {}, 2, "one of the arguments --once --every is required"),
    ("autotune negative alpha", "dashboard.control.autotune", ["--once", "--alpha", "-1"], {}, 2, "alpha must be in (0, 1)"),
    ("autotune negative every", "dashboard.control.autotune", ["--every", "-1"], {}, 2, "--every must be positive"),
    ("autotune target above 1", "dashboard.control.autotune", ["--once", "--target", "5"], {}, 2, "target false-hit rate"),
    ("autotune canary share above 1", "dashboard.control.autotune", ["--once", "--canary-share", "2"], {}, 2,
     "--canary-share must be in [0, 1]"),
    ("autotune refused warehouse", "dashboard.control.autotune", ["--once"], {}, 1, "autotune: run failed"),
    ("autotune bad warehouse url", "dashboard.control.autotune", ["--once"], {"SCACHE_CLICKHOUSE__URL": "notaurl"}, 1,
     "ClickHouse URL must be http(s)://host[:port]"),
    ("stack no command", "infra.stack", [], {}, 2, "the following arguments are required: command"),
    ("stack negative rate", "infra.stack", ["demo", "--rate", "-1"], {}, 2, "--rate must be a positive number"),
    ("stack nan rate", "infra.stack", ["demo", "--rate", "nan"], {}, 2, "--rate must be a positive number"),
    ("stack infinite rate", "infra.stack", ["demo", "--rate", "inf"], {}, 2, "--rate must be a positive number"),
    ("stack zero window", "infra.stack", ["demo", "--window-s", "0"], {}, 2, "--window-s must be at least 1"),
    ("serve zero window", "infra.stack", ["serve", "--window-s", "0"], {}, 2, "--window-s must be at least 1"),
    ("serve port out of range", "infra.stack", ["serve", "--port", "70000"], {}, 2, "--port must be in 1-65535"),
    ("serve bad setting", "infra.stack", ["serve"], {"SCACHE_DASHBOARD__AUTOTUNE_EVERY_S": "0"}, 2,
     "stack: invalid settings: SCACHE_DASHBOARD__AUTOTUNE_EVERY_S='0'"),
    ("scache no command", "infra.cli", [], {}, 2, "usage: scache COMMAND"),
    ("scache unknown command", "infra.cli", ["bogus"], {}, 2, "scache: unknown command 'bogus'"),
    ("replay no file", "infra.replay", [], {}, 2, "the following arguments are required: file"),
    ("replay missing file", "infra.replay", ["/nonexistent/log.jsonl"], {}, 2, "replay: /nonexistent/log.jsonl: no such file"),
    ("replay not utf-8", "infra.replay", [F % "garbage"], {}, 2, "not UTF-8 text"),
    ("replay not json", "infra.replay", [F % "notjson"], {}, 2, ":2: not JSON"),
    ("replay unknown field", "infra.replay", [F % "question"], {}, 2, "unknown fields ['question']"),
    ("replay zero rate", "infra.replay", [F % "ok", "--rate", "0"], {}, 2, "--rate must be a positive number"),
    ("replay nan rate", "infra.replay", [F % "ok", "--rate", "nan"], {}, 2, "--rate must be a positive number"),
    ("replay no running cache", "infra.replay", [F % "ok"], {}, 2, "no running cache found"),
    ("replay refused url", "infra.replay", [F % "ok", "--url", f"http://127.0.0.1:{REFUSED}"], {}, 1,
     "the cache did not answer"),
    ("replay unparsable url", "infra.replay", [F % "ok", "--url", "http://[::1"], {}, 2, "--url 'http://[::1'"),
    ("topics unknown flag", "infra.kafka.topics", ["--bogus"], {}, 2, "unrecognized arguments"),
    ("topics bootstrap without port", "infra.kafka.topics", ["--bootstrap", "notahost:port"], {}, 2,
     "bootstrap server 'notahost:port' is not host:port"),
    ("topics empty bootstrap", "infra.kafka.topics", ["--bootstrap", ""], {}, 2, "bootstrap server '' is not host:port"),
    ("topics refused broker", "infra.kafka.topics", ["--timeout-s", "3"], {}, 1, "Unable to bootstrap"),
    ("topics bad timeout", "infra.kafka.topics", ["--timeout-s", "0"], {}, 2, "--timeout-s must be a positive number"),
    ("broker no data dir", "infra.kafka.broker", [], {}, 2, "the following arguments are required: --data-dir"),
    ("broker port not a number", "infra.kafka.broker", ["--data-dir", "x", "--port", "abc"], {}, 2, "invalid int value"),
    ("broker port out of range", "infra.kafka.broker", ["--data-dir", "x", "--port", "70000"], {}, 2,
     "--port must be 1-65535 (omit it for a free port), got 70000"),
    ("broker same ports", "infra.kafka.broker", ["--data-dir", "x", "--port", "9000", "--controller-port", "9000"], {}, 2,
     "--port and --controller-port must differ"),
    ("broker bad heap", "infra.kafka.broker", ["--data-dir", "x", "--heap", "lots"], {}, 2, "--heap takes a JVM size"),
    ("broker data dir under a file", "infra.kafka.broker", ["--data-dir", (F % "ok") + "/x"], {}, 1, "Not a directory"),
    ("flink no command", "infra.flink.cluster", [], {}, 2, "the following arguments are required: command"),
    ("flink zero slots", "infra.flink.cluster", ["start", "--slots", "0", "--run-dir", F % "dir"], {}, 2,
     "--slots must be at least 1"),
    ("flink slots not a number", "infra.flink.cluster", ["start", "--slots", "abc"], {}, 2, "invalid int value"),
    ("flink status without cluster", "infra.flink.cluster", ["status", "--run-dir", F % "dir"], {}, 1, "no cluster started"),
    ("flink submit without cluster", "infra.flink.cluster", ["submit", "--run-dir", F % "dir"], {}, 1, "no cluster started"),
    ("warehouse unknown flag", "infra.clickhouse.warehouse", ["--bogus"], {}, 2, "unrecognized arguments"),
    ("warehouse port not a number", "infra.clickhouse.warehouse", ["--port", "abc"], {}, 2, "invalid int value"),
    ("warehouse negative port", "infra.clickhouse.warehouse", ["--port", "-1"], {}, 2, "--port must be 0-65535"),
    ("warehouse port too large", "infra.clickhouse.warehouse", ["--port", "70000"], {}, 2, "--port must be 0-65535"),
    ("warehouse data dir is a file", "infra.clickhouse.warehouse", ["--data-dir", F % "ok", "--port", "0"], {}, 1,
     "File exists"),
]


@pytest.fixture(scope="module")
def runs(files, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every case's run, four at a time (each is mostly interpreter start-up and imports, and
    the refused broker waits out its bootstrap timeout)."""
    fill = lambda text: re.sub(r"@file:(\w+)", lambda m: str(files[m.group(1)]), text)

    def run(case, module, args, env):
        tmp = tmp_path_factory.mktemp("run")
        argv = [sys.executable, "-m", module, *map(fill, args)]
        # A regression that starts services (the demo) gets SIGTERM first: it stops what it started
        # (they run in sessions of their own); then its own session is killed.
        child = subprocess.Popen(argv, cwd=REPO_ROOT, env=_env(tmp, {k: fill(v) for k, v in env.items()}),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = child.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            child.terminate()
            try:
                out, err = child.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                out, err = child.communicate()
            err += "\n[still running after 180 s: killed]"
        return case, subprocess.CompletedProcess(argv, child.returncode, out, err)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(lambda c: run(*c[:4]), CASES))


@pytest.mark.parametrize("case, status, reason", [(c[0], c[4], c[5]) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_command_line_exits_with_one_line(runs, case, status, reason):
    done = runs[case]
    assert "Traceback" not in done.stderr, f"{case}:\n{done.stderr[-3000:]}"
    assert done.returncode == status, f"{case}: exit {done.returncode}\n{done.stderr[-2000:]}"
    lines = [line for line in done.stderr.splitlines() if reason in line]
    assert lines, f"{case}: no stderr line says {reason!r}:\n{done.stderr[-2000:]}"
