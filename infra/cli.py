"""scache: a semantic cache for LLM traffic. One command for every command line of the project.

    scache demo|serve|replay|test|autotune|seed|settings|judge-train|judge-eval [ARGS]   (scache COMMAND --help for each)

Installed by ``pip install .`` (console script ``scache``). Each subcommand is the module's own ``main`` (``python -m infra.stack serve`` is ``scache serve``). In a
clone, ``./scache`` does the same after setting up the virtualenv and the jars.
"""
from __future__ import annotations

import importlib
import sys

from infra.runtime import REPO_ROOT

# command -> (module whose main() runs it, arguments put before the user's, one-line help)
COMMANDS: dict[str, tuple[str, list[str], str]] = {
    "demo": ("infra.stack", ["demo"], "start the embedded stack and replay banking77 traffic live"),
    "serve": ("infra.stack", ["serve"], "start the embedded stack for your own application"),
    "replay": ("infra.replay", [], "send a query log (JSON Lines / CSV) through the running cache"),
    "test": ("pytest", [], "run the test suite (from a clone: it needs tests/ and the services' jars)"),
    "autotune": ("dashboard.control.autotune", [], "tune the arms' thresholds from the warehouse, once or on a schedule"),
    "seed": ("cache_core.seed", [], "store a file of answers into a running cache"),
    "settings": ("cache_core.settings", [], "list every SCACHE_* setting and the values in effect"),
    "judge-train": ("cache_core.decision.judge_train", [], "train a judge (the hit rule's second stage) from labelled pairs"),
    "judge-eval": ("cache_core.decision.judge_eval", [], "check judges on labelled pairs they never saw, beside cosine"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return ("usage: scache COMMAND [ARGS]   (scache COMMAND --help for its options)\n\n"
            + __doc__.splitlines()[0] + "\n\ncommands:\n" + "\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"scache: unknown command {command!r}; choose from {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name, prefix, _ = COMMANDS[command]
    if command == "test":
        if not (REPO_ROOT / "tests").is_dir():
            print(f"scache: test runs the suite of a clone ({REPO_ROOT / 'tests'} does not exist)", file=sys.stderr)
            return 2
        rest = ["-p", "no:cacheprovider", "--rootdir", str(REPO_ROOT), *(rest or [str(REPO_ROOT / "tests")])]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # an extra that is not installed (pytest: the test extra)
        print(f"scache {command}: {exc} (install the extra it needs, e.g. pip install 'scache[test]')",
              file=sys.stderr)
        return 2
    return int(module.main(prefix + rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
