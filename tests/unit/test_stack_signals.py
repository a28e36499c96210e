"""Ctrl-C pressed again while the embedded stack stops (infra.stack._run): every service still stops,
the command exits 0 and prints no traceback."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from infra.runtime import group_alive

REPO_ROOT = Path(__file__).resolve().parents[2]

# Two stand-in services that each take 1.5 s to stop on SIGTERM, run by the real _run.
SCRIPT = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    from infra.runtime import Service
    from infra.stack import Stack, _run

    SLOW = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), sys.exit(0))); time.sleep(60)"
    stack = Stack(state_dir=Path(sys.argv[1]))
    for name in ("first", "second"):
        proc = subprocess.Popen([sys.executable, "-c", SLOW], start_new_session=True)
        stack.services.append(Service(name, proc, Path(sys.argv[1]) / f"{name}.log"))
    banner = lambda: "up " + " ".join(str(s.proc.pid) for s in stack.services)
    sys.exit(_run(stack, lambda: None, banner, lambda: time.sleep(60)))
""")


def test_a_second_ctrl_c_while_stopping_still_stops_every_service_without_a_traceback(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT)
    line = proc.stdout.readline()
    assert line.startswith("up "), line + proc.stderr.read()
    pids = [int(p) for p in line.split()[1:]]  # each its own process group (start_new_session)
    time.sleep(0.5)  # the stand-ins have set their SIGTERM handlers
    proc.send_signal(signal.SIGINT)
    time.sleep(0.7)  # inside stop: the first service is taking its 1.5 s
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "still stopping the services" in err
    deadline = time.monotonic() + 5
    while any(group_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(group_alive(pid) for pid in pids)
