"""python -m dashboard.control.autotune: bad arguments get a one-line message and exit 2, before any I/O."""
import pytest

from dashboard.control import autotune


@pytest.mark.parametrize("args, message", [
    (["--canary-share", "1.5"], "--canary-share must be in [0, 1], got 1.5"),
    (["--explore-share", "-0.1"], "--explore-share must be in [0, 1], got -0.1"),
    (["--explore-memory-s", "-1"], "explore memory must not be negative"),
    (["--target", "0"], "target false-hit rate must be in (0, 1)"),
])
def test_bad_arguments_exit_2_with_the_reason(args, message, capsys):
    assert autotune.main(["--once", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autotune: ") and message in err and "Traceback" not in err


def test_explore_memory_defaults_to_a_week():
    args = autotune._parser().parse_args(["--once"])
    assert args.explore_memory_s == 7 * 86400 and args.explore_share is None
