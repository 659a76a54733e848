"""synapse-sim: generate or import a trace, replay it through Synapse and the baselines.

    synapse-sim generate --mix gang-heavy --load 0.9 --days 7 -o t.csv
    synapse-sim import-sacct sacct.txt -o t.csv
    synapse-sim run t.csv --policies fifo,greedy,easy,synapse --json
    synapse-sim sweep --loads 0.7,0.9,1.1 --seeds 1,2,3 --report out/
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import click
import yaml

from synapse.common.cli import CONTEXT_SETTINGS, fail, version_option
from synapse.core.queues import QueueFileError, parse_queue_file
from synapse.sim import trace as tracefile
from synapse.sim.generate import MIXES, Recipe, generate
from synapse.sim.metrics import summarize
from synapse.sim.policies import DEFAULT_POLICIES, POLICIES, parse_policies
from synapse.sim.replay import SPREAD_FACTOR, replay
from synapse.sim.trace import ClusterShape, Trace, TraceError

PROG = "synapse-sim"


def _shape_options(fn):
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
    against FIFO, greedy and EASY backfill, on the same simulated cluster."""


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
@_shape_options
@click.option("-o", "--output", default="-", show_default=True, help="Where to write the trace CSV.")
def generate_cmd(mix, load, days, seed, failures, size_exponent, queue_mix, nodes, gpus_per_node, racks, output):
    """Write a synthetic trace from published statistics (Philly durations, Venus arrivals).

    The CSV's columns are described in the README ("Evaluation") and at the top of
    synapse/sim/trace.py; its first lines record the cluster shape and these options."""
    try:
        recipe = Recipe(shape=_shape(nodes, gpus_per_node, racks), mix=mix, load=load, days=days, seed=seed,
                        failures=failures, size_exponent=size_exponent, queue_mix=_queue_mix(queue_mix))
        trace = generate(recipe)
    except TraceError as exc:
        fail(PROG, str(exc))
    _write(tracefile.dumps(trace), output)


main.add_command(generate_cmd, "generate")


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


def load_trace(path: str, nodes, gpus_per_node, racks) -> tuple[Trace, ClusterShape]:
    trace = tracefile.read(path)
    if not trace.jobs:
        raise TraceError(f"{path}: no jobs")
    shape = _shape(nodes, gpus_per_node, racks, trace.shape)
    trace.check(shape)
    return trace, shape


def load_queues(path: str | None, trace: Trace) -> tuple:
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
        from synapse.core.model import Queue

        queues = tuple(Queue(name=n) for n in sorted({j.queue for j in trace.jobs} - {"", "default"}))
    unknown = sorted({j.queue for j in trace.jobs} - {q.name for q in queues} - {"", "default"})
    if unknown:
        raise TraceError(f"the trace names queue {unknown[0]}, which {path} does not define")
    return queues


@main.command(context_settings=CONTEXT_SETTINGS)
@click.argument("trace_path", metavar="TRACE")
@click.option("--policies", default=",".join(DEFAULT_POLICIES), show_default=True,
              help=f"Comma-separated, of: {', '.join(POLICIES)}.")
@click.option("--json", "as_json", is_flag=True, help='Print {"policies": {NAME: {metric: value}}}.')
@click.option("--spread-factor", type=click.FloatRange(0.05, 1.0), default=SPREAD_FACTOR, show_default=True,
              help="Speed of a gang split across racks, relative to one in a rack (1: no penalty).")
@click.option("--queues", "queues_path", help="A queue file (as synctl apply takes) for the trace's queues.")
@click.option("--warmup-hours", type=float, default=0.0, show_default=True,
              help="Leave jobs submitted in the first hours out of the metrics.")
@click.option("--report", "report_dir", help="Also write an HTML report with plots into this directory.")
@_shape_options
def run(trace_path, policies, as_json, spread_factor, queues_path, warmup_hours, report_dir, nodes, gpus_per_node,
        racks):
    """Replay TRACE through each policy on the same simulated cluster and compare them."""
    try:
        chosen = parse_policies(policies)
        trace, shape = load_trace(trace_path, nodes, gpus_per_node, racks)
        queues = load_queues(queues_path, trace)
    except (TraceError, ValueError) as exc:
        fail(PROG, str(exc))
    runs = [replay(trace, shape, p, spread_factor=spread_factor, queues=queues) for p in chosen]
    summaries = {r.policy: summarize(r, warmup=warmup_hours * 3600) for r in runs}
    if report_dir:
        from synapse.sim.report import write_report

        try:
            page = write_report(report_dir, runs, summaries, title=f"{Path(trace_path).name} on {shape.describe()}")
        except OSError as exc:
            fail(PROG, f"cannot write the report: {exc}", 1)
        click.echo(f"report: {page}", err=True)
    if as_json:
        click.echo(json.dumps({"trace": trace_path, "cluster": shape.describe(), "spread_factor": spread_factor,
                               "policies": _json_safe(summaries)}, indent=2))
    else:
        click.echo(table(summaries, f"{len(trace.jobs)} jobs, {shape.describe()}, spread factor {spread_factor:g}"))


def _json_safe(value):
    """nan and inf are not JSON: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


#: (heading, metric, scale, format) of the table `run` prints.
TABLE = (("jobs", "jobs", 1, "{:.0f}"), ("mean JCT h", "mean_jct_s", 3600, "{:.2f}"),
         ("p50 JCT h", "p50_jct_s", 3600, "{:.2f}"), ("p99 JCT h", "p99_jct_s", 3600, "{:.1f}"),
         ("mean wait h", "mean_wait_s", 3600, "{:.2f}"), ("p99 wait h", "p99_wait_s", 3600, "{:.1f}"),
         ("big p99 wait h", "big_gang_p99_wait_s", 3600, "{:.1f}"), ("big max wait h", "big_gang_max_wait_s", 3600,
                                                                      "{:.1f}"),
         ("util", "utilisation", 0.01, "{:.1f}%"), ("1-rack", "single_rack_share", 0.01, "{:.1f}%"),
         ("racks", "mean_racks_spanned", 1, "{:.2f}"), ("sched p99 ms", "sched_p99_ms", 1, "{:.2f}"))


def table(summaries: dict[str, dict], caption: str) -> str:
    rows = [["policy", *(h for h, *_ in TABLE)]]
    for name, s in summaries.items():
        rows.append([name, *(("-" if s[k] is None or math.isnan(s[k]) else f.format(s[k] / scale))
                             for _, k, scale, f in TABLE)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths,
                                                                                                  strict=True)))
             for r in rows]
    return "\n".join([caption, *lines]) + "\n"
