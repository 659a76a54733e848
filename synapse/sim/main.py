"""synapse-sim: generate or import a trace, replay it through Synapse and the baselines.

    synapse-sim generate --mix gang-heavy --load 0.9 --days 7 -o t.csv
    synapse-sim import-sacct sacct.txt -o t.csv
    synapse-sim run t.csv --policies fifo,greedy,easy,easy++,synapse --json
    synapse-sim run t.csv --policies easy,synapse --jitter 60     # the noise floor of the comparison
    synapse-sim run t.csv --node-mtbf 200 --checkpoint-every 10m --restart-cost 1m --recovery back
    synapse-sim sweep --loads 0.7,0.9,1.1 --seeds 1,2,3 --report out/
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml

from synapse.common.cli import CONTEXT_SETTINGS, fail, version_option
from synapse.core.model import Queue
from synapse.core.queues import QueueFileError, parse_queue_file
from synapse.sim import trace as tracefile
from synapse.sim.failures import RECOVERIES, FailureModel
from synapse.sim.generate import MIXES, RECURRENCE, WITHIN_CV, Recipe, generate
from synapse.sim.metrics import Summary, summarize
from synapse.sim.noise import NOISE_METRICS, jittered, noise_floor, spread, values_of, versus
from synapse.sim.policies import DEFAULT_POLICIES, POLICIES, Policy, parse_policies, tuned
from synapse.sim.replay import SPREAD_FACTOR, RunResult, replay
from synapse.sim.trace import ClusterShape, Trace, TraceError

PROG = "synapse-sim"

_F = TypeVar("_F", bound=Callable[..., object])


def _shape_options(fn: _F) -> _F:
    for option in reversed((
        click.option("--nodes", type=int, help="Nodes of the cluster [trace's, else 64]."),
        click.option("--gpus-per-node", type=int, help="GPUs of each node [trace's, else 8]."),
        click.option("--racks", type=int, help="Racks, nodes spread evenly [trace's, else 8]."),
    )):
        fn = option(fn)
    return fn


def _shape(nodes: int | None, gpus_per_node: int | None, racks: int | None, base: ClusterShape | None = None,
           ) -> ClusterShape:
    base = base or ClusterShape()
    return ClusterShape(nodes=nodes or base.nodes, gpus_per_node=gpus_per_node or base.gpus_per_node,
                        racks=racks or base.racks)


def _write(text: str, output: str | None) -> None:
    if output in (None, "-"):
        click.echo(text, nl=False)
        return
    try:
        Path(output).write_text(text)
    except OSError as exc:
        fail(PROG, f"cannot write {output}: {exc}", 1)


@click.group(context_settings=CONTEXT_SETTINGS)
@version_option(PROG)
def main() -> None:
    """Trace-driven evaluation: Synapse's real state machine and queue policy on a simulated clock,
    against FIFO, greedy, EASY backfill and EASY++ (EASY by the same predictor), on the same simulated cluster."""


@main.command(context_settings=CONTEXT_SETTINGS)
@click.option("--mix", type=click.Choice(sorted(MIXES)), default="gang-heavy", show_default=True,
              help="Job size mix: Philly's classic one, or an LLM-era gang-heavy one.")
@click.option("--load", type=float, default=0.9, show_default=True,
              help="Offered load: GPU-seconds asked for over GPU-seconds the cluster has in the trace's days.")
@click.option("--days", type=float, default=7.0, show_default=True, help="Days of submissions.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--failures", type=float, default=0.0, show_default=True,
              help="Share of jobs that fail early (after U(0, 0.5) of their run time).")
@click.option("--size-exponent", type=float, default=0.3, show_default=True,
              help="Gangs above 8 GPUs run (gpus/8)^this longer (the size-length correlation).")
@click.option("--queue-mix", default="", metavar="NAME=SHARE,...",
              help="Submit jobs to these queues in these shares (e.g. research=0.7,vision=0.3).")
@click.option("--recurrence", type=float, default=RECURRENCE, show_default=True, metavar="SHARE",
              help="Share of jobs that resubmit one of their user's job templates (0: today's traces, "
                   "no users or names).")
@click.option("--within-cv", type=float, default=WITHIN_CV, show_default=True, metavar="CV",
              help="Coefficient of variation of a template's run times.")
@_shape_options
@click.option("-o", "--output", default="-", show_default=True, help="Where to write the trace CSV.")
def generate_cmd(mix: str, load: float, days: float, seed: int, failures: float, size_exponent: float,
                 queue_mix: str, recurrence: float, within_cv: float, nodes: int | None, gpus_per_node: int | None,
                 racks: int | None, output: str) -> None:
    """Write a synthetic trace from published statistics (Philly durations, Venus arrivals).

    The CSV's columns are described in the docs (docs/evaluation/) and at the top of
    synapse/sim/trace.py; its first lines record the cluster shape and these options."""
    try:
        recipe = Recipe(shape=_shape(nodes, gpus_per_node, racks), mix=mix, load=load, days=days, seed=seed,
                        failures=failures, size_exponent=size_exponent, queue_mix=_queue_mix(queue_mix),
                        recurrence=recurrence, within_cv=within_cv)
        trace = generate(recipe)
    except TraceError as exc:
        fail(PROG, str(exc))
    _write(tracefile.dumps(trace), output)


main.add_command(generate_cmd, "generate")


@main.command("profile", context_settings=CONTEXT_SETTINGS)
@click.argument("trace_path", metavar="TRACE")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def profile_cmd(trace_path: str, as_json: bool) -> None:
    """How well the leader's run-time predictor (synapse.core.schedule.predict) guesses this trace's runs:
    the share of jobs predicted within +-10 %, +-50 %, +-100 % and 10x, beside Helios's estimator."""
    from synapse.sim.profile import BOUNDS, HELIOS, error_profile

    try:
        shares = error_profile(tracefile.read(trace_path))
    except TraceError as exc:
        fail(PROG, str(exc))
    if as_json:
        click.echo(json.dumps(shares, indent=1))
        return
    labels = [label for label, _ in BOUNDS]
    click.echo("| predictor | " + " | ".join(labels) + " |")
    click.echo("|---" * (len(labels) + 1) + "|")
    click.echo("| user + name + size (EASY++ rule) | " + " | ".join(f"{shares[k]:.0%}" for k in labels) + " |")
    click.echo("| Helios's estimator (published) | " + " | ".join(f"{h:.0%}" for h in HELIOS) + " |")
    basis = ", ".join(f"{k.removeprefix('basis_')} {v:.0%}" for k, v in shares.items() if k.startswith("basis_"))
    click.echo(f"predicted from: {basis}")


def _queue_mix(text: str) -> tuple[tuple[str, float], ...]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, share = part.partition("=")
        try:
            value = float(share)
        except ValueError:
            raise TraceError(f"--queue-mix: {part!r} is not NAME=SHARE") from None
        if not name or not value > 0:
            raise TraceError(f"--queue-mix: {part!r} needs a name and a share above 0")
        out.append((name, value))
    return tuple(out)


@main.command("import-sacct", context_settings=CONTEXT_SETTINGS)
@click.argument("export", metavar="SACCT_EXPORT")
@_shape_options
@click.option("--skip-bad", is_flag=True,
              help="Import the rows that can be read and name each bad one on stderr (default: import nothing).")
@click.option("-o", "--output", default="-", show_default=True, help="Where to write the trace CSV.")
def import_sacct(export: str, nodes: int | None, gpus_per_node: int | None, racks: int | None, skip_bad: bool,
                 output: str) -> None:
    """Turn a Slurm accounting export (sacct --parsable2) into a trace.

    Export with: sacct --allusers --parsable2 --starttime ... --endtime ...
    --format JobID,JobName,Submit,Start,End,State,AllocTRES,ReqTRES,NNodes,Timelimit,User

    A bad row (times out of order, a field that cannot be read) stops the import, naming every bad
    line; --skip-bad imports the others. Give the cluster's shape (--nodes, --gpus-per-node,
    --racks) to record it in the trace; a job the shape cannot hold is an error here rather than at
    replay."""
    from synapse.sim.sacct import BadRow, describe_skipped
    from synapse.sim.sacct import read as read_sacct

    bad: list[BadRow] | None = [] if skip_bad else None
    try:
        trace, skipped = read_sacct(export, bad)
        if nodes or gpus_per_node or racks:
            trace.shape = _shape(nodes, gpus_per_node, racks)
            trace.check(trace.shape)
    except TraceError as exc:
        fail(PROG, str(exc))
    for row in bad or ():
        click.echo(f"{export}:{row.line}: skipped: {row.reason}", err=True)
    click.echo(f"{len(trace.jobs)} jobs; skipped {describe_skipped(skipped, bad or [])}", err=True)
    _write(tracefile.dumps(trace), output)


def load_trace(path: str, nodes: int | None, gpus_per_node: int | None, racks: int | None,
               min_gpus: int | None = None) -> tuple[Trace, ClusterShape]:
    trace = tracefile.read(path)
    if min_gpus:
        trace = dataclasses.replace(trace, jobs=[j for j in trace.jobs if j.gpus >= min_gpus])
        if not trace.jobs:
            raise TraceError(f"{path}: no job asks for {min_gpus} GPUs or more")
    if not trace.jobs:
        raise TraceError(f"{path}: no jobs")
    shape = _shape(nodes, gpus_per_node, racks, trace.shape)
    trace.check(shape)
    return trace, shape


def load_queues(path: str | None, trace: Trace) -> tuple[Queue, ...]:
    """The queues of a queue file (as `synctl apply` takes), or one of weight 1 per queue the trace names."""
    if path:
        try:
            doc = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise TraceError(f"{path}: cannot read: {exc}") from None
        try:
            queues = tuple(parse_queue_file(doc))
        except QueueFileError as exc:
            raise TraceError(f"{path}: {exc}") from None
    else:
        queues = tuple(Queue(name=n) for n in sorted({j.queue for j in trace.jobs} - {"", "default"}))
    unknown = sorted({j.queue for j in trace.jobs} - {q.name for q in queues} - {"", "default"})
    if unknown:
        raise TraceError(f"the trace names queue {unknown[0]}, which {path} does not define")
    return queues


def _above_zero(_ctx: click.Context, _param: click.Parameter, value: float | None) -> float | None:
    """--jitter's check: seconds above 0, a finite number."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value:g} is not a number of seconds above 0")
    return value


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("trace_path", metavar="TRACE")
@click.option("--policies", default=",".join(DEFAULT_POLICIES), show_default=True,
              help=f"Comma-separated, of: {', '.join(POLICIES)}.")
@click.option("--json", "as_json", is_flag=True, help='Print {"policies": {NAME: {metric: value}}}.')
@click.option("--spread-factor", type=click.FloatRange(0.05, 1.0), default=SPREAD_FACTOR, show_default=True,
              help="Speed of a gang split across racks, relative to one in a rack (1: no penalty).")
@click.option("--queues", "queues_path",
              help="A queue file (as synctl apply takes) for the trace's queues; synapse's policies preempt "
                   "(the leader's step) for jobs of the queues it defines, `default` included.")
@click.option("--warmup-hours", type=float, default=0.0, show_default=True,
              help="Leave jobs submitted in the first hours out of the metrics.")
@click.option("--report", "report_dir", help="Also write an HTML report with plots into this directory.")
@click.option("--tuning", default="", metavar="KEY=VALUE,...",
              help="Change the knobs of Synapse's policies (synapse.core.schedule.reservations.Tuning: reservations, "
                   "locality_wait_s, weigh_locality, spread_factor, switch_share, switch_min_s, reevaluate_s, "
                   "backfill_by_user, drain_by_user, shortest_backfill, backfill_user_factor, "
                   "drain_user_factor, guess_wait_s), "
                   "for ablations.")
@click.option("--min-gpus", type=click.IntRange(min=1), default=None, metavar="N",
              help="Replay only the jobs of at least N GPUs, as if nothing else were submitted (64: the big "
                   "gangs alone, how little they could wait with the cluster to themselves).")
@click.option("--jitter", "jitter_s", type=float, callback=_above_zero, metavar="SECONDS",
              help="The noise floor: also replay copies of the trace with each submission later by U(0, SECONDS), "
                   "and give each metric's range over them and each policy's ratio to the first one, copy by copy.")
@click.option("--repeats", type=click.IntRange(min=1), default=None, help="Jittered copies, with --jitter [4].")
@click.option("--jitter-seed", type=int, default=None, help="Seed of the copies' shifts, with --jitter [1].")
@click.option("--workers", type=click.IntRange(1, 64), default=None,
              help="Jittered copies replayed at once (processes), with --jitter [1].")
@click.option("--node-mtbf", "mtbf_hours", type=float, metavar="HOURS",
              help="Simulate node failures: each node fails after exponential times of this mean (hours), the "
                   "same times for every policy; reports goodput and the GPU-hours failures lost.")
@click.option("--checkpoint-every", default="0", show_default=True, metavar="DURATION",
              help="With --node-mtbf: a gang checkpoints every DURATION of its run (10m, 1h; 0: never).")
@click.option("--restart-cost", default="0", show_default=True, metavar="DURATION",
              help="With --node-mtbf: added to the run of a gang restarted after a failure.")
@click.option("--repair-time", default="1h", show_default=True, metavar="DURATION",
              help="With --node-mtbf: a failed node comes back after this long.")
@click.option("--recovery", type=click.Choice(RECOVERIES), default="front", show_default=True,
              help="With --node-mtbf: a gang stopped by a failure is re-placed first, at its place (front: "
                   "Synapse's rule), the same with spare nodes in every rack (spares: Synapse's policies), or "
                   "is resubmitted behind what arrived since (back: simulated only).")
@click.option("--spares-per-rack", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --recovery spares: spare nodes kept in each rack.")
@click.option("--failure-seed", type=int, default=None,
              help="With --node-mtbf: seed of the failure times [the trace's generation seed, else 1].")
@click.option("--exact-runs", "exact", is_flag=True, help="An oracle: easy++ and synapse know every run exactly, "
              "each job a kind of its own (only jobs with a user: generate --recurrence 0 gives none).")
@_shape_options
def run(trace_path: str, policies: str, as_json: bool, spread_factor: float, queues_path: str | None,
        warmup_hours: float, report_dir: str | None, tuning: str, min_gpus: int | None, jitter_s: float | None,
        repeats: int | None, jitter_seed: int | None, workers: int | None, mtbf_hours: float | None,
        checkpoint_every: str, restart_cost: str, repair_time: str, recovery: str, spares_per_rack: int,
        failure_seed: int | None, exact: bool, nodes: int | None, gpus_per_node: int | None, racks: int | None) -> None:
    """Replay TRACE through each policy on the same simulated cluster and compare them."""
    if jitter_s is None and (repeats is not None or jitter_seed is not None or workers is not None):
        fail(PROG, "--repeats, --jitter-seed and --workers go with --jitter SECONDS")
    try:
        chosen = parse_policies(policies)
        if tuning:
            if not any(p.tunable for p in chosen):
                raise ValueError("--tuning changes Synapse's policies, and none is chosen")
            chosen = [tuned(p, tuning) if p.tunable else p for p in chosen]
        trace, shape = load_trace(trace_path, nodes, gpus_per_node, racks, min_gpus)
        queues = load_queues(queues_path, trace)
        failures = _failure_model(trace, mtbf_hours, checkpoint_every, restart_cost, repair_time, recovery,
                                  failure_seed, spares_per_rack)
    except (TraceError, ValueError) as exc:
        fail(PROG, str(exc))

    runs = _replays(trace, shape, chosen, spread_factor, queues, failures, exact)
    summaries = _summarized(runs, warmup_hours * 3600)
    only = f" (only those of {min_gpus}+ GPUs)" if min_gpus else ""
    caption = f"{len(trace.jobs)} jobs{only}, {shape.describe()}, spread factor {spread_factor:g}" + \
        (", every run known exactly (--exact-runs)" if exact else "")
    if failures:
        caption += (f"; node failures: MTBF {failures.mtbf_s / 3600:g} h, repair {failures.repair_s:g} s, checkpoint "
                    f"every {failures.checkpoint_every_s:g} s, restart {failures.restart_cost_s:g} s, recovery "
                    f"{failures.recovery}" + (f" ({failures.spares_per_rack} per rack)" if failures.recovery == "spares"
                                              else "") + f", seed {failures.seed}")
    text = table(summaries, caption, FAILURE_TABLE if failures else ())
    noise = None
    if jitter_s is not None:
        seed = 1 if jitter_seed is None else jitter_seed
        traces = jittered(trace, jitter_s, repeats or 4, seed)
        one_copy = functools.partial(_copy_summaries, shape=shape, policies=chosen, spread_factor=spread_factor,
                                     queues=queues, warmup_s=warmup_hours * 3600, failures=failures, exact=exact)
        if (workers or 1) > 1:
            with ProcessPoolExecutor(workers) as pool:
                copies = list(pool.map(one_copy, traces))
        else:
            copies = [one_copy(t) for t in traces]
        noise = noise_floor(summaries, copies, seconds=jitter_s, seed=seed)
    noise_text = noise_table(noise) if noise else ""
    if report_dir:
        _report(report_dir, runs, summaries, f"{Path(trace_path).name}{only} on {shape.describe()}", text + noise_text)
    if as_json:
        out: dict[str, Any] = {"trace": trace_path, "cluster": shape.describe(), "spread_factor": spread_factor,
               "tuning": tuning, "min_gpus": min_gpus, "exact_runs": exact, "policies": _json_safe(summaries)}
        if failures:
            out["failures"] = dataclasses.asdict(failures)
        if noise:
            out["jitter"] = _json_safe(noise)
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(text + queue_table(summaries) + noise_text)


def _failure_model(trace: Trace, mtbf_hours: float | None, checkpoint_every: str, restart_cost: str,
                   repair_time: str, recovery: str, seed: int | None, spares_per_rack: int = 1) -> FailureModel | None:
    """The failure options of `run`, checked; None without --node-mtbf."""
    from synapse.core.jobs.quantity import QuantityError, parse_duration

    if mtbf_hours is None:
        return None
    seconds = {}
    for flag, text in (("--checkpoint-every", checkpoint_every), ("--restart-cost", restart_cost),
                       ("--repair-time", repair_time)):
        try:
            seconds[flag] = parse_duration(text)
        except QuantityError as exc:
            raise ValueError(f"{flag}: {exc}") from None
    if seed is None:
        seed = next((int(word[5:]) for line in trace.comments for word in line.split()
                     if word.startswith("seed=") and word[5:].isdigit()), 1)
    model = FailureModel(mtbf_s=mtbf_hours * 3600, checkpoint_every_s=seconds["--checkpoint-every"],
                         restart_cost_s=seconds["--restart-cost"], repair_s=seconds["--repair-time"],
                         recovery=recovery, seed=seed, spares_per_rack=spares_per_rack)
    problem = model.problem()
    if problem:
        raise ValueError(problem)
    return model


def _replays(trace: Trace, shape: ClusterShape, policies: list[Policy], spread_factor: float,
             queues: tuple[Queue, ...], failures: FailureModel | None = None, exact: bool = False) -> list[RunResult]:
    return [replay(trace, shape, p, spread_factor=spread_factor, queues=queues, failures=failures, exact_runs=exact)
            for p in policies]


def _summarized(runs: list[RunResult], warmup_s: float) -> dict[str, Summary]:
    return {r.policy: summarize(r, warmup=warmup_s) for r in runs}


def _copy_summaries(trace: Trace, *, shape: ClusterShape, policies: list[Policy], spread_factor: float,
                    queues: tuple[Queue, ...], warmup_s: float, failures: FailureModel | None = None,
                    exact: bool = False) -> dict[str, Summary]:
    """One jittered copy through every policy, summarised (a module-level function: --workers
    sends it to other processes)."""
    return _summarized(_replays(trace, shape, policies, spread_factor, queues, failures, exact), warmup_s)


def noise_table(noise: dict[str, Any]) -> str:
    """Per metric: each policy on the trace as given, its range over the jittered copies, and its
    ratio to the baseline (range over all copies, and on how many it is at or below / above)."""
    copies, baseline, n = noise["copies"], noise["baseline"], noise["repeats"] + 1
    out = [f"\nnoise floor: {n - 1} copies of the trace, each submission later by U(0, {noise['seconds']:g} s) "
           f"(seed {noise['seed']}); ratios to {baseline} over all {n} copies, the trace as given included\n"]
    for heading, key, scale, form in NOISE_METRICS:
        base = values_of(copies[baseline], key)
        rows = [["policy", "as given", "jittered", f"/ {baseline}", f"<= {baseline}", f">= {baseline}"]]
        for name, summaries in copies.items():
            s = spread(values_of(summaries, key))
            row = [name, _cell(s.given, scale, form), _span(s.low, s.high, scale, form)]
            if name != baseline:
                v = versus(values_of(summaries, key), base)
                row += [_span(v.low, v.high, 1, "{:.2f}"), f"{v.at_or_below}/{n}", f"{v.at_or_above}/{n}"]
            rows.append(row + [""] * (6 - len(row)))
        out.append(_aligned(heading, rows))
    return "\n".join(out)


def _report(directory: str, runs: list[RunResult], summaries: dict[str, Summary], title: str, text: str,
            sweep: dict[str, Any] | None = None) -> None:
    from synapse.sim.report import ReportError, write_report

    try:
        page = write_report(directory, runs, summaries, title=title, sweep=sweep, table_text=text)
    except OSError as exc:
        fail(PROG, f"cannot write the report: {exc}", 1)
    except ReportError as exc:
        fail(PROG, str(exc), 1)
    click.echo(f"report: {page}", err=True)


def queue_table(summaries: dict[str, Summary]) -> str:
    """Per policy and queue: share of the GPU-hours against weight, waits; and Jain's index."""
    lines = []
    for name, s in summaries.items():
        if "queues" not in s:
            continue
        parts = [f"{q}: {v['share']:.0%} of GPU-h (weight {v['weight']:g}), mean wait {v['mean_wait_s'] / 3600:.2f} h"
                 for q, v in s["queues"].items()]
        lines.append(f"{name}: jain {s['jain_fairness']:.3f}; " + "; ".join(parts))
    return ("queues (fair share)\n" + "\n".join(lines) + "\n") if lines else ""


def _json_safe(value: object) -> object:
    """nan and inf are not JSON: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


#: (heading, metric, scale, format) of one column of the table `run` prints.
Column = tuple[str, str, float, str]

#: The columns of the table `run` prints.
TABLE: tuple[Column, ...] = (("jobs", "jobs", 1, "{:.0f}"), ("mean JCT h", "mean_jct_s", 3600, "{:.2f}"),
         ("p50 JCT h", "p50_jct_s", 3600, "{:.2f}"), ("p99 JCT h", "p99_jct_s", 3600, "{:.1f}"),
         ("mean wait h", "mean_wait_s", 3600, "{:.2f}"), ("p99 wait h", "p99_wait_s", 3600, "{:.1f}"),
         ("big p99 wait h", "big_gang_p99_wait_s", 3600, "{:.1f}"), ("big max wait h", "big_gang_max_wait_s", 3600,
                                                                      "{:.1f}"),
         ("useful util", "useful_utilisation", 0.01, "{:.1f}%"), ("alloc util", "utilisation", 0.01, "{:.1f}%"),
         ("1-rack", "single_rack_share", 0.01, "{:.1f}%"),
         ("racks", "mean_racks_spanned", 1, "{:.2f}"), ("sched p99 ms", "sched_p99_ms", 1, "{:.2f}"),
         ("preempt", "preemptions", 1, "{:.0f}"), ("lost GPU-h", "lost_gpu_hours", 1, "{:.0f}"))


#: The columns `run` adds with --node-mtbf.
FAILURE_TABLE: tuple[Column, ...] = (
                 ("failures", "node_failures", 1, "{:.0f}"), ("goodput", "goodput", 0.01, "{:.1f}%"),
                 ("fail-lost GPU-h", "failure_lost_gpu_hours", 1, "{:.0f}"),
                 ("work-lost GPU-h", "failure_work_lost_gpu_hours", 1, "{:.0f}"),
                 ("requeue-wait GPU-h", "requeue_wait_gpu_hours", 1, "{:.0f}"),
                 ("big mean JCT h", "big_gang_mean_jct_s", 3600, "{:.2f}"),
                 ("failed big", "failed_big_gangs", 1, "{:.0f}"),
                 ("failed big JCT h", "failed_big_gang_mean_jct_s", 3600, "{:.2f}"))


def table(summaries: dict[str, Summary], caption: str, extra: tuple[Column, ...] = ()) -> str:
    columns = TABLE + tuple(extra)
    rows = [["policy", *(h for h, *_ in columns)]]
    for name, s in summaries.items():
        rows.append([name, *(_cell(s[k], scale, f) for _, k, scale, f in columns)])
    return _aligned(caption, rows)


def _cell(value: float | None, scale: float, form: str) -> str:
    return "-" if value is None or math.isnan(value) else form.format(value / scale)


def _span(low: float, high: float, scale: float, form: str) -> str:
    return "-" if math.isnan(low) else f"{_cell(low, scale, form)}–{_cell(high, scale, form)}"


def _aligned(caption: str, rows: list[list[str]]) -> str:
    """The caption, then the rows in columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths,
                                                                                                  strict=True)))
             .rstrip() for r in rows]
    return "\n".join([caption, *lines]) + "\n"


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise TraceError(f"{what}: {text!r} is not a comma-separated list of numbers") from None
    if not values:
        raise TraceError(f"{what}: empty")
    return values


@main.command(context_settings=CONTEXT_SETTINGS)
@click.option("--loads", default="0.7,0.9,1.1", show_default=True, help="Offered loads, comma-separated.")
@click.option("--seeds", default="1,2,3", show_default=True, help="Seeds: one trace per load and seed.")
@click.option("--mix", type=click.Choice(sorted(MIXES)), default="gang-heavy", show_default=True)
@click.option("--days", type=float, default=7.0, show_default=True)
@click.option("--failures", type=float, default=0.0, show_default=True)
@click.option("--policies", default="fifo,greedy,easy,easy++,synapse", show_default=True,
              help=f"Comma-separated, of: {', '.join(POLICIES)}.")
@click.option("--spread-factor", type=click.FloatRange(0.05, 1.0), default=SPREAD_FACTOR, show_default=True)
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Replays run in this many processes.")
@click.option("--json", "as_json", is_flag=True, help="Print every sample, the intervals and the claims.")
@click.option("--report", "report_dir", help="Write an HTML report with the sweep curves into this directory.")
@click.option("--recurrence", type=float, default=RECURRENCE, show_default=True, metavar="SHARE",
              help="As for generate: share of jobs that resubmit a template of their user (0: none).")
@click.option("--within-cv", type=float, default=WITHIN_CV, show_default=True, metavar="CV",
              help="As for generate: coefficient of variation of a template's run times.")
@click.option("--baseline", default="easy,easy++", show_default=True,
              help="Policies every other one is paired with, seed by seed (ratios of mean JCT and big-gang p99 "
                   "wait, difference of useful utilisation), comma-separated; those not replayed are skipped.")
@_shape_options
def sweep(loads: str, seeds: str, mix: str, days: float, failures: float, policies: str, spread_factor: float,
          workers: int, as_json: bool, report_dir: str | None, recurrence: float, within_cv: float, baseline: str,
          nodes: int | None, gpus_per_node: int | None, racks: int | None) -> None:
    """Replay generated traces at several loads and seeds; means with 95 % confidence intervals.

    A ratio of synapse to another policy is claimed only where the two intervals do not overlap."""
    from synapse.sim.sweep import sweep as run_sweep

    try:
        chosen = [p.name for p in parse_policies(policies)]
        load_list = _floats(loads, "--loads")
        seed_list = [int(s) for s in _floats(seeds, "--seeds")]
        base = Recipe(shape=_shape(nodes, gpus_per_node, racks), mix=mix, days=days, failures=failures,
                      recurrence=recurrence, within_cv=within_cv)
        for load in load_list:
            problem = dataclasses.replace(base, load=load).problem()
            if problem:
                raise TraceError(problem)
    except (TraceError, ValueError) as exc:
        fail(PROG, str(exc))
    keep = min(load_list, key=lambda x: abs(x - 0.9))
    result, kept = run_sweep(base, load_list, seed_list, chosen, spread_factor=spread_factor, workers=workers,
                             keep=keep, baseline=tuple(b.strip() for b in baseline.split(",") if b.strip()))
    text = sweep_table(result)
    if report_dir:
        summaries = {r.policy: summarize(r) for r in kept}
        _report(report_dir, kept, summaries, f"{mix}, {days:g} days, {base.shape.describe()}: load sweep over "
                f"seeds {seeds}; per-run plots at load {keep:g}, seed {seed_list[0]}", text, sweep=result)
    click.echo(json.dumps(_json_safe(result), indent=2) if as_json else text)


def sweep_table(result: dict[str, Any]) -> str:
    metrics = (("mean JCT h", "mean_jct_s", 3600), ("big p99 wait h", "big_gang_p99_wait_s", 3600),
               ("useful util", "useful_utilisation", 1), ("1-rack", "single_rack_share", 1))
    n = len(result["seeds"])
    lines = [f"mean ± 95% CI half-width over {n} seed(s)"]
    for li, load in enumerate(result["loads"]):
        lines.append(f"load {load:g}")
        for policy, curves in result["policies"].items():
            cells = []
            for label, key, scale in metrics:
                mean, half = curves[key][li]
                cells.append(f"{label} {mean / scale:.2f}" + ("" if math.isnan(half) else f"±{half / scale:.2f}"))
            lines.append(f"  {policy:<15}" + "  ".join(cells))
        for other, by_metric in result["claims_synapse_over"].items():
            lines.append(f"  synapse/{other}: mean JCT {by_metric['mean_jct_s'][li]}; "
                         f"big p99 wait {by_metric['big_gang_p99_wait_s'][li]}")
        for policy, by_metric, base in ((p, m, b) for b, by_policy in result.get("paired_with", {}).items()
                                        for p, m in by_policy.items()):
            cells = []
            for key, label, scale in (("mean_jct_s", "mean JCT", 1), ("big_gang_p99_wait_s", "big p99 wait", 1),
                                      ("useful_utilisation", "useful util pt", 100)):
                p = by_metric[key][li]
                half = "" if math.isnan(p["half"]) else f"±{p['half'] * scale:.3f}"
                worst = f" (max {p['max'] * scale:.2f})" if key != "useful_utilisation" else \
                    f" (min {p['min'] * scale:+.2f})"
                cells.append(f"{label} {p['mean'] * scale:.3f}{half}{worst}")
            lines.append(f"  {policy}/{base} by seed: " + "; ".join(cells))
    return "\n".join(lines) + "\n"


@main.command("fair-share", context_settings=CONTEXT_SETTINGS)
@click.option("--days", type=click.IntRange(2, 60), default=7, show_default=True, help="Days to simulate.")
@click.option("--half-life", default="7d", show_default=True, help="The usage half-life to compare with 0.")
@click.option("--weights", default="1,3", show_default=True, help="Queue weights of team A and team B.")
@click.option("--nodes", type=click.IntRange(1, 512), default=8, show_default=True, help="8-GPU nodes.")
def fair_share_cmd(days: int, half_life: str, weights: str, nodes: int) -> None:
    """Two teams, a week: does fair share remember the GPU time a team used (synapse.sim.fairshare)?"""
    from synapse.core.jobs.quantity import QuantityError, parse_duration
    from synapse.sim.fairshare import table, two_teams

    try:
        seconds = parse_duration(half_life)
    except QuantityError as exc:
        fail(PROG, f"--half-life: {exc}")
    try:
        pair = _floats(weights, "--weights")
    except TraceError as exc:
        fail(PROG, str(exc))
    if len(pair) != 2 or min(pair) <= 0:
        fail(PROG, "--weights: two weights above 0, e.g. 1,3")
    runs = [two_teams(h, days=days, weights=(pair[0], pair[1]), nodes=nodes) for h in (seconds, 0.0)]
    click.echo(f"team A {pair[0]:g} : team B {pair[1]:g} (A's fair share {pair[0] / sum(pair):.1%}); "
               f"{nodes} nodes of 8 GPUs; A alone on day 1")
    click.echo(table(runs[0], runs[1], seconds / 86400))
