"""Print the simulator's per-job records of traces replayed through policies, one JSON line each.

For checking that a change of structure changes no behaviour: replay the same traces before and
after it and compare the outputs byte for byte.

    for s in 1 2 3; do synapse-sim generate --mix gang-heavy --days 7 --seed $s -o week-$s.csv; done
    python3 scripts/sim_records.py --policies fifo,greedy,easy,synapse,synapse-flat,synapse-strict \\
        week-1.csv week-2.csv week-3.csv > after.jsonl

Each line is a job's `synapse.sim.replay.JobRecord` with its trace and policy (NaN as null); after
each replay, one line with the run's unfinished jobs, preemptions and events simulated.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import click

from synapse.sim.main import load_trace
from synapse.sim.policies import parse_policies
from synapse.sim.replay import replay


def _plain(value: object) -> object:
    return None if isinstance(value, float) and math.isnan(value) else value


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--policies", default="fifo,greedy,easy,synapse,synapse-flat", show_default=True)
@click.argument("traces", nargs=-1, required=True)
def main(policies: str, traces: tuple[str, ...]) -> None:
    """Replay each of TRACES through each policy; print every job's record as a JSON line."""
    chosen = parse_policies(policies)
    for path in traces:
        trace, shape = load_trace(path, None, None, None)
        name = Path(path).name
        for policy in chosen:
            run = replay(trace, shape, policy)
            for record in run.records:
                fields = {k: _plain(v) for k, v in dataclasses.asdict(record).items()}
                click.echo(json.dumps({"trace": name, "policy": run.policy, **fields}, sort_keys=True))
            click.echo(json.dumps({"trace": name, "policy": run.policy, "unfinished": run.unfinished,
                                   "preemptions": run.preemptions, "events": run.events}, sort_keys=True))


if __name__ == "__main__":
    main()
