"""Scheduled threshold tuning: evaluate running canaries, then recommend and push changes.

One run, for every experiment (or the ones named):
1. each arm with a canary: ``evaluate_canary`` on the canary's labelled hits
   since it started; promote or roll back when the verdict is confident. A canary that
   loosens is promoted only once its measured hit rate confirms the replayed gain, and
   rolled back when it refutes it (``canary_gain``);
2. each multi-similarity arm without a canary: ``tuning_multi.recommend_multi`` over the
   lookback window picks its score floor and answer margin (replayed from the logged
   mixed scores, never under the lowest floor / margin they were logged at). A higher floor
   and margin go out directly (``publishing.push_multi``: they serve a subset of what runs
   now); a lower one only as a canary on ``--canary-share`` of the arm's units, refused at 0
   (``rollout``: every loosening gets a fresh sequential test). An arm held
   at its best replayable pair explores instead (``tuning_multi.multi_exploration``): a canary
   with the score floor one max step lower (``changes.start_multi_canary``), judged in
   step 1 like any canary. This comes before the thresholds: the floor / margin search
   reaches the band of false hits itself, where an over-target threshold can only rise by
   the max step;
3. each judged arm without a canary: ``tuning_judge.recommend_cuts`` tunes the judge's operating
   point (its probability cut) from verdicts by judge probability, with the same bound; a lower cut
   goes out as a canary on ``--canary-share`` of the arm's units, a higher one directly. Its cosine
   threshold (then a floor) is left alone;
4. each arm without a judge (and, with ``--clusters``, each intent cluster) without a canary:
   ``tuning.recommend`` over the same window; an arm-level change goes out as a
   canary on ``--canary-share`` of the arm's units (0: a raise is pushed directly, a lower
   threshold refused), a cluster's raise directly, a cluster's lower threshold is refused
   (a canary tries one threshold on the whole arm; ``rollout``). An arm held at its best
   supported threshold with no labels below it explores instead (``tuning.exploration``): a canary one max step down on
   ``--explore-share`` of its units (default: the canary share), which step 1 of a later
   run promotes or rolls back. Never directly; ``--no-explore`` turns it off. A canary the
   audit shows rolled back within ``--explore-memory-s`` keeps the arm's explorations
   above the value it tried.

A run first audits config versions that reached the control topic without audit rows
(``publishing.sync_audit``: pushes through the cache's admin API). Every push uses the
version just read (optimistic concurrency) and lands in the audit table, so the
cool-down applies to the next run; an arm changed earlier in a run (canary
verdict, floor / margin) holds its other changes until the next one.

CLI (any scheduler can run it)::

    python -m dashboard.control.autotune --once [--experiment threshold-ab] [--dry-run]
    python -m dashboard.control.autotune --every 300 --target 0.03 --clusters
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Literal

import pandas as pd

from cache_core.events import ControlMessage, now_ms
from cache_core.experiments import ExperimentConfig
from cache_core.settings import Settings, settings_or_exit
from dashboard.control import canary_gain, changes, publishing, queries, rollout, tuning, tuning_judge, tuning_multi
from dashboard.control.guardrails import Guardrails
from dashboard.control.canary import RolledBack, configs_by_version, evaluate_canary, last_failed_try, rolled_back_canaries
from dashboard.control.stats import ProportionStat

log = logging.getLogger(__name__)

DEFAULT_LOOKBACK_S = 6 * 3600
DEFAULT_CANARY_SHARE = 0.1


@dataclass(frozen=True)
class TuneAction:
    """What one run did (or, dry, would do) for one arm / cluster."""

    experiment_id: str
    arm: str
    cluster: int | None
    kind: Literal["canary", "recommendation", "multi", "judge"]
    action: str
    """promote / rollback / continue for canaries; change / hold / explore for recommendations."""
    reason: str
    applied: bool
    version: int | None = None
    """The config version published, when applied."""
    threshold: float | None = None
    score_floor: float | None = None
    """multi: the recommended score floor (None: hold)."""
    answer_margin: float | None = None
    """multi: the recommended answer margin (None: hold)."""
    accept_at: float | None = None
    """judge: the recommended probability cut (None: hold)."""


def canary_labels(client, experiment_id: str, arm: str, since_ms: int) -> ProportionStat:
    """Labelled hits (n, wrong) of the arm's canary units since the canary started."""
    return _canary_row(queries.canary_stats(client, experiment_id, arm, since_ms))


def canary_shadow_labels(client, experiment_id: str, arm: str, since_ms: int) -> ProportionStat:
    """The canary's hits as shadow checks judged them (n, wrong), apart from the users' labels."""
    return _canary_row(queries.canary_shadow_stats(client, experiment_id, arm, since_ms))


def _canary_row(df) -> ProportionStat:
    row = df[df["variant"] == "canary"]
    if row.empty:
        return ProportionStat(0, 0)
    correct, wrong = int(row["correct"].iloc[0]), int(row["wrong"].iloc[0])
    return ProportionStat(correct + wrong, wrong)


def _push(settings: Settings, config: ExperimentConfig, change: changes.Change, actor: str, reason: str,
          client, clock) -> ExperimentConfig:
    message = publishing.publish_change(settings, config.experiment_id, change, actor, reason,
                                     expected_version=config.version, client=client, clock=clock)
    return message.experiment


def tune_experiment(settings: Settings, experiment_id: str, guardrails: Guardrails, *, client,
                    apply: bool = True, actor: str = "autotune", lookback_s: float = DEFAULT_LOOKBACK_S,
                    clusters: bool = False, canary_share: float = DEFAULT_CANARY_SHARE,
                    explore: bool = True,
                    explore_share: float | None = None, clock: Callable[[], int] = now_ms) -> list[TuneAction]:
    """One auto-tune pass over one experiment (see the module docstring). Explorations go
    out on ``explore_share`` of the arm's units (None: ``canary_share``); 0 turns them off."""
    config, topic = publishing.live_state(settings, experiment_id)  # one read of the control topic
    if apply:  # admin-API pushes reach only the topic: audit them, so the history below is whole
        publishing.sync_audit(settings, experiment_id, client, topic)
    explore_share = 0.0 if not explore else canary_share if explore_share is None else explore_share
    actions: list[TuneAction] = []
    touched: set[str] = set()
    for arm in config.arms:
        if arm.canary is None:
            continue
        started = arm.canary.started_at_ms
        decision = evaluate_canary(arm.canary, canary_labels(client, experiment_id, arm.name, started),
                                   min_labelled=guardrails.min_labelled, alpha=guardrails.alpha,
                                   shadow=canary_shadow_labels(client, experiment_id, arm.name, started))
        if decision.action == "promote" and canary_gain.loosens(arm):
            units = queries.canary_unit_stats(client, experiment_id, arm.name, started)
            decision = canary_gain.gate_promotion(decision, arm, units, guardrails.alpha)
        applied = apply and decision.action != "continue"
        if applied:
            change = changes.promote_canary(arm.name) if decision.action == "promote" else changes.rollback_canary(arm.name)
            config = _push(settings, config, change, actor, f"canary {decision.action}: {decision.reason}", client, clock)
            touched.add(arm.name)
        actions.append(TuneAction(experiment_id, arm.name, None, "canary", decision.action, decision.reason,
                                  applied, config.version if applied else None, arm.canary.threshold))
    now = clock()
    end = datetime.fromtimestamp(now / 1000, tz=timezone.utc)
    filters = queries.Filters(experiment_id, end - timedelta(seconds=lookback_s), end + timedelta(seconds=1))
    last = queries.last_changes(client, experiment_id)
    last_ms = queries.last_change_ms(last)
    history = queries.change_history(client, experiment_id)
    configs = logged_configs(settings, client, config, history=history, topic=topic)
    failed = rolled_back_canaries(history, configs)
    # Multi arms' what-if re-applies their current score floor / answer margin to the logs.
    rules = queries.multi_rules(config)
    recommendations = tuning.recommend_all(config, queries.similarity_histogram(client, filters, rules),
                                           queries.labelled_similarity(client, filters, rules), guardrails,
                                           now_ms=now, last_change_ms=last_ms, clusters=clusters,
                                           shadow_labelled=queries.shadow_labelled(client, filters))
    if rules:  # before the thresholds: see the module docstring
        config = _tune_multi(settings, config, guardrails, filters, rules, touched, now, last_ms, actions,
                             client=client, apply=apply, actor=actor, canary_share=canary_share,
                             explore_share=explore_share,
                             configs=configs, failed=failed, clock=clock)
    if any(arm.judge is not None for arm in config.arms):
        config = _tune_judges(settings, config, guardrails, filters, touched, now, last_ms, actions, client=client,
                              apply=apply, actor=actor, canary_share=canary_share, clock=clock)
    for rec in recommendations:
        if explore_share > 0 and rec.arm not in touched:
            rec = tuning.exploration(rec, last_failed_try(failed, rec.arm, "threshold", now, guardrails)) or rec
        if rec.arm in touched and rec.action == "change":
            rec = tuning.Recommendation(rec.arm, rec.cluster, rec.current, None, "hold",
                                        "cool-down: this arm changed earlier in this run")
        share = explore_share if rec.action == "explore" else canary_share
        route = rollout.threshold_rollout(rec, share)
        if route.route == "refused":
            rec = replace(rec, recommended=None, action="hold", reason=f"{route.reason} ({rec.reason})")
        applied = apply and route.route in ("canary", "direct")
        if applied:
            reason = f"auto-tune: {rec.reason}" if rec.action == "explore" else \
                f"auto-tune: {rec.reason} (bound {rec.false_hit_upper:.2%} at {_labels(rec)})"
            if route.route == "canary":
                change = changes.start_canary(rec.arm, rec.recommended, share,
                                              guardrails.target_false_hit_rate, at_ms=clock())
            elif rec.cluster is not None:
                change = changes.set_cluster_threshold(rec.arm, rec.cluster, rec.recommended)
            else:
                change = changes.set_threshold(rec.arm, rec.recommended)
            config = _push(settings, config, change, actor, reason, client, clock)
            touched.add(rec.arm)
        actions.append(TuneAction(experiment_id, rec.arm, rec.cluster, "recommendation", rec.action, rec.reason,
                                  applied, config.version if applied else None, rec.recommended))
    return actions


def _labels(rec: tuning.Recommendation) -> str:
    """The verdicts a recommendation's bound rests on, for its audit reason."""
    if rec.basis == "shadow":
        return f"{rec.shadow_labelled} shadow verdicts"
    return f"{rec.labelled} labels" + (f" and {rec.shadow_labelled} shadow verdicts" if rec.basis == "users + shadow" else "")


def logged_configs(settings: Settings, client, config: ExperimentConfig, *, history: pd.DataFrame | None = None,
                   topic: list[ControlMessage] | None = None) -> dict[int, ExperimentConfig]:
    """Every config version of the experiment known to the audit (``history``, else read), the
    experiments file, the control topic (``topic``, else read: admin-API pushes have no audit
    rows until ``publishing.sync_audit``) and the live one."""
    if history is None:
        history = queries.change_history(client, config.experiment_id)
    if topic is None:
        topic = publishing.config_history(settings, config.experiment_id)
    return configs_by_version(history, publishing.file_configs(settings).get(config.experiment_id),
                                     *[m.experiment for m in topic], config)


def _tune_multi(settings: Settings, config: ExperimentConfig, guardrails: Guardrails, filters, rules,
                touched: set[str], now: int, last_ms: dict[str, int], actions: list[TuneAction], *, client,
                apply: bool, actor: str, canary_share: float, explore_share: float,
                configs: dict[int, ExperimentConfig], failed: list[RolledBack],
                clock: Callable[[], int]) -> ExperimentConfig:
    """Step 2 of the module docstring for multi arms' score floor and answer margin (raises
    pushed directly, lower values on a canary of ``canary_share`` or refused, explorations
    as a canary on ``explore_share``, 0: none); appends to
    ``actions`` and returns the config after its pushes."""
    recommendations = tuning_multi.recommend_multi_all(config, queries.multi_score_histogram(client, filters, rules),
                                                 configs, guardrails, now_ms=now, last_change_ms=last_ms)
    for rec in recommendations:
        if explore_share > 0 and rec.arm not in touched:
            rec = tuning_multi.multi_exploration(
                rec, last_failed_try(failed, rec.arm, "score_floor", now, guardrails)) or rec
        if rec.arm in touched and rec.action == "change":
            rec = replace(rec, recommended_floor=None, recommended_margin=None, action="hold",
                          reason="cool-down: this arm changed earlier in this run")
        route = rollout.multi_rollout(rec, explore_share if rec.action == "explore" else canary_share)
        if route.route == "refused":
            rec = replace(rec, recommended_floor=None, recommended_margin=None, action="hold",
                          reason=f"{route.reason} ({rec.reason})")
        moved = [(name, old, new) for name, old, new in (
            ("score floor", rec.current_floor, rec.recommended_floor),
            ("answer margin", rec.current_margin, rec.recommended_margin)) if new is not None and abs(old - new) > 1e-9]
        if apply and route.route == "canary":
            share = explore_share if rec.action == "explore" else canary_share
            changed = {name for name, _, _ in moved}
            change = changes.start_multi_canary(
                rec.arm, share, guardrails.target_false_hit_rate, clock(),
                score_floor=rec.recommended_floor if "score floor" in changed else None,
                answer_margin=rec.recommended_margin if "answer margin" in changed else None)
            config = _push(settings, config, change, actor, f"auto-tune: {rec.reason}", client, clock)
            touched.add(rec.arm)
        elif apply and route.route == "direct":
            reason = (f"auto-tune: {'; '.join(f'{n} {o:.3f} -> {w:.3f}' for n, o, w in moved)}: {rec.reason} "
                      f"(bound {rec.false_hit_upper:.2%} at {rec.labelled} labels)")
            message = publishing.push_multi(settings, config.experiment_id, rec.arm, actor, reason,
                                         score_floor=rec.recommended_floor, answer_margin=rec.recommended_margin,
                                         client=client, expected_version=config.version, clock=clock)
            config = message.experiment
            touched.add(rec.arm)
        applied = apply and route.route in ("canary", "direct")
        actions.append(TuneAction(config.experiment_id, rec.arm, None, "multi", rec.action, rec.reason, applied,
                                  config.version if applied else None, None, rec.recommended_floor,
                                  rec.recommended_margin))
    return config


def _tune_judges(settings: Settings, config: ExperimentConfig, guardrails: Guardrails, filters,
                 touched: set[str], now: int, last_ms: dict[str, int], actions: list[TuneAction], *, client,
                 apply: bool, actor: str, canary_share: float, clock: Callable[[], int]) -> ExperimentConfig:
    """Judged arms' operating points (``tuning_judge``): a lower cut goes out as a canary on
    ``canary_share`` of the arm's units (0: refused), a higher one directly; appends to ``actions``
    and returns the config after its pushes."""
    def cut_of(judge):
        return tuning_judge.current_cut(judge, settings.cache.judge_dir)

    recommendations = tuning_judge.recommend_cuts(config, queries.judge_probabilities(client, filters), guardrails,
                                                  now_ms=now, cut_of=cut_of, last_change_ms=last_ms)
    for rec in recommendations:
        if rec.arm in touched and rec.action == "change":
            rec = replace(rec, recommended=None, action="hold", reason="cool-down: this arm changed earlier in this run")
        if rec.loosens and rec.action == "change" and canary_share <= 0:  # every loosening through a canary
            rec = replace(rec, recommended=None, action="hold",
                          reason=f"a lower cut goes out only as a canary, and the canary share is 0 ({rec.reason})")
        applied = apply and rec.action == "change"
        if applied:
            labels = f"{rec.shadow_labelled} shadow verdicts" if rec.basis == "shadow" else f"{rec.labelled} labels"
            reason = (f"auto-tune: judge {rec.version} cut {rec.current:.3f} -> {rec.recommended:.3f}: {rec.reason} "
                      f"(bound {rec.false_hit_upper:.2%} at {labels})")
            if rec.loosens:
                change = changes.start_judge_canary(rec.arm, rec.recommended, canary_share,
                                                    guardrails.target_false_hit_rate, at_ms=clock())
            else:
                change = changes.set_judge_cut(rec.arm, rec.recommended)
            config = _push(settings, config, change, actor, reason, client, clock)
            touched.add(rec.arm)
        actions.append(TuneAction(config.experiment_id, rec.arm, None, "judge", rec.action, rec.reason, applied,
                                  config.version if applied else None, accept_at=rec.recommended))
    return config


def known_experiments(settings: Settings) -> list[str]:
    """Experiment ids on the control topic or in the experiments file."""
    from cache_core.publish.control_topic import read_latest_configs
    return sorted(set(read_latest_configs(settings.kafka)) | set(publishing.file_configs(settings)))


def run_once(settings: Settings, guardrails: Guardrails, experiment_ids: Iterable[str] | None = None,
             **options) -> list[TuneAction]:
    """``tune_experiment`` for each experiment; one failing experiment does not stop the rest."""
    from cache_core.chclient import connect
    client = options.pop("client", None) or connect(settings.clickhouse)
    actions: list[TuneAction] = []
    for experiment_id in experiment_ids or known_experiments(settings):
        try:
            actions += tune_experiment(settings, experiment_id, guardrails, client=client, **options)
        except (ValueError, publishing.AuditWriteError) as exc:
            log.warning("auto-tune skipped an experiment", extra={"experiment_id": experiment_id, "error": str(exc)})
            actions.append(TuneAction(experiment_id, "", None, "recommendation", "error", str(exc), False))
    return actions


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dashboard.control.autotune", description=__doc__.split("\n\n")[0])
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--once", action="store_true", help="run one pass and exit")
    when.add_argument("--every", type=float, metavar="SECONDS", help="run a pass every SECONDS until stopped")
    p.add_argument("--experiment", action="append", help="only this experiment (repeatable)")
    p.add_argument("--target", type=float, default=None, help="false-hit rate ceiling (default: settings)")
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--min-decisions", type=int, default=200)
    p.add_argument("--min-labelled", type=int, default=30)
    p.add_argument("--max-step", type=float, default=0.03)
    p.add_argument("--cooldown-s", type=float, default=1800)
    p.add_argument("--lookback-s", type=float, default=DEFAULT_LOOKBACK_S)
    p.add_argument("--clusters", action="store_true", help="also tune per intent cluster")
    p.add_argument("--canary-share", type=float, default=DEFAULT_CANARY_SHARE,
                   help="share of an arm's units that try a threshold change (or a lower multi floor / "
                        "margin) first (0: raises are pushed directly, lower values refused; also the "
                        "exploration share unless --explore-share is given)")
    p.add_argument("--no-explore", dest="explore", action="store_false",
                   help="never try a threshold (or multi score floor) below what the logs support on a "
                        "canary (default: explore when the explore share > 0)")
    p.add_argument("--explore-share", type=float, default=None,
                   help="share of an arm's units an exploration runs on (default: --canary-share)")
    p.add_argument("--explore-memory-s", type=float, default=Guardrails.explore_memory_s,
                   help="how long a rolled-back canary keeps explorations above the value it tried "
                        "(default: 7 days)")
    p.add_argument("--dry-run", action="store_true",
                   help="recommend and evaluate, publish nothing and write no audit rows")
    p.add_argument("--actor", default="autotune")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    settings = settings_or_exit("autotune")
    try:
        guardrails = Guardrails(
            target_false_hit_rate=args.target if args.target is not None else settings.dashboard.target_false_hit_rate,
            alpha=args.alpha, min_decisions=args.min_decisions, min_labelled=args.min_labelled,
            max_step=args.max_step, cooldown_s=args.cooldown_s, explore_memory_s=args.explore_memory_s)
        for flag, share in (("--canary-share", args.canary_share), ("--explore-share", args.explore_share)):
            if share is not None and not 0 <= share <= 1:
                raise ValueError(f"{flag} must be in [0, 1], got {share}")
        if args.every is not None and args.every <= 0:
            raise ValueError(f"--every must be positive, got {args.every}")
    except ValueError as exc:
        print(f"autotune: {exc}", file=sys.stderr)
        return 2
    options = dict(apply=not args.dry_run, actor=args.actor, lookback_s=args.lookback_s, clusters=args.clusters,
                   canary_share=args.canary_share, explore=args.explore,
                   explore_share=args.explore_share)
    while True:
        try:
            for action in run_once(settings, guardrails, args.experiment, **options):
                print(json.dumps(asdict(action)), flush=True)
        except Exception as exc:  # broker or warehouse down: say so; a scheduled loop keeps going
            print(f"autotune: run failed: {exc}", file=sys.stderr, flush=True)
            if args.once:
                return 1
        if args.once:
            return 0
        time.sleep(args.every)


if __name__ == "__main__":
    sys.exit(main())
