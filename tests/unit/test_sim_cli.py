"""synapse-sim's command line: generate, import-sacct, run, sweep, and bad input without tracebacks."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from synapse.sim.main import main
from synapse.sim.sacct import parse as parse_sacct
from synapse.sim.sacct import parse_timelimit
from synapse.sim.trace import TraceError
from tests.support import paths

SHAPE = ["--nodes", "8", "--gpus-per-node", "8", "--racks", "2"]


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "t.csv"
    result = invoke("generate", "--mix", "philly", "--days", "1", "--load", "0.8", "--seed", "3", *SHAPE,
                    "--recurrence", "0", "-o", str(path))
    assert result.exit_code == 0, result.output
    return path


def test_generate_then_run_prints_every_policy_as_json(trace_file):
    result = invoke("run", str(trace_file), "--policies", "fifo,greedy,easy,synapse,synapse-flat", "--json")
    assert result.exit_code == 0, result.output
    policies = json.loads(result.output)["policies"]
    assert list(policies) == ["fifo", "greedy", "easy", "synapse", "synapse-flat"]
    for metrics in policies.values():
        for key in ("jobs", "mean_jct_s", "p50_jct_s", "p99_jct_s", "mean_wait_s", "p99_wait_s", "big_gang_p99_wait_s",
                    "big_gang_max_wait_s", "utilisation", "single_rack_share", "mean_racks_spanned", "sched_p99_ms"):
            assert key in metrics
        assert metrics["jobs"] == len(trace_file.read_text().splitlines()) - 4
        assert 0 < metrics["utilisation"] <= 1
    assert policies["synapse"]["single_rack_share"] > policies["synapse-flat"]["single_rack_share"]


def test_tuning_changes_synapse_s_knobs_and_leaves_the_baselines_alone(tmp_path):
    path = tmp_path / "gangs.csv"  # a day of gangs on 32 nodes: reservations and rack waits matter
    assert invoke("generate", "--mix", "gang-heavy", "--nodes", "32", "--racks", "4", "--days", "1", "--load", "1.1",
                  "--seed", "2", "--recurrence", "0", "-o", str(path)).exit_code == 0
    runs = {}
    knobs = "reservations=4,reserve_within_s=inf,locality_wait_s=0"
    for label, extra in (("default", ()), ("tuned", ("--tuning", knobs))):
        result = invoke("run", str(path), "--policies", "easy,synapse", "--json", *extra)
        assert result.exit_code == 0, result.output
        runs[label] = json.loads(result.output)
    assert runs["tuned"]["tuning"] == knobs
    outcome = ("jobs", "mean_jct_s", "mean_wait_s", "p99_wait_s", "utilisation", "single_rack_share")
    for policy, same in (("easy", True), ("synapse", False)):
        before, after = (tuple(runs[r]["policies"][policy][k] for k in outcome) for r in ("default", "tuned"))
        assert (before == after) is same, (policy, before, after)


def test_min_gpus_replays_the_big_jobs_alone(tmp_path):
    path = tmp_path / "gangs.csv"
    assert invoke("generate", "--mix", "gang-heavy", "--nodes", "32", "--racks", "4", "--days", "1", "--load", "1.0",
                  "--seed", "4", "-o", str(path)).exit_code == 0
    rows = [line.split(",") for line in path.read_text().splitlines() if not line.startswith("#")]
    gpus = rows[0].index("gpus")
    big = sum(int(r[gpus]) >= 64 for r in rows[1:])
    assert 0 < big < len(rows) - 1
    runs = {}
    for label, extra in (("all", ()), ("big", ("--min-gpus", "64"))):
        result = invoke("run", str(path), "--policies", "greedy,easy", "--json", *extra)
        assert result.exit_code == 0, result.output
        runs[label] = json.loads(result.output)
    assert runs["big"]["min_gpus"] == 64 and runs["all"]["min_gpus"] is None
    for policy in ("greedy", "easy"):
        assert runs["big"]["policies"][policy]["jobs"] == big
        assert runs["all"]["policies"][policy]["jobs"] == len(rows) - 1


def test_run_prints_a_table_and_uses_the_traces_cluster(trace_file):
    result = invoke("run", str(trace_file), "--policies", "easy")
    assert result.exit_code == 0, result.output
    assert "nodes=8 gpus_per_node=8 racks=2" in result.output and "\neasy " in result.output


def test_run_writes_a_report_with_plots(trace_file, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["run", str(trace_file), "--policies", "greedy,synapse", "--report", str(out)])
    assert result.exit_code == 0, result.output
    page = (out / "index.html").read_text()
    for png in ("wait-by-size.png", "utilisation.png", "jct-cdf.png"):
        assert png in page and (out / png).read_bytes().startswith(b"\x89PNG")


def test_sweep_gives_intervals_over_seeds(tmp_path):
    result = invoke("sweep", "--mix", "philly", "--days", "0.5", "--loads", "0.5,1.0", "--seeds", "1,2",
                    "--policies", "greedy,synapse", *SHAPE, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["loads"] == [0.5, 1.0]
    mean, half = data["policies"]["synapse"]["mean_jct_s"][1]
    assert mean > 0 and half is not None and half >= 0
    assert len(data["samples"]["synapse"]["mean_jct_s"][0]) == 2
    assert set(data["claims_synapse_over"]) == {"greedy"}


def test_run_and_sweep_compare_with_easy_plus_plus_by_default(trace_file):
    result = invoke("run", str(trace_file), "--json")
    assert result.exit_code == 0, result.output
    assert "easy++" in json.loads(result.output)["policies"]
    result = invoke("sweep", "--mix", "philly", "--days", "0.5", "--loads", "0.5", "--seeds", "1,2",
                    "--policies", "easy,easy++,synapse", *SHAPE)
    assert result.exit_code == 0, result.output
    for pair in ("synapse/easy by seed", "synapse/easy++ by seed", "easy++/easy by seed"):
        assert pair in result.output
    assert "easy/easy++ by seed" in result.output  # each baseline against the other too


def test_queues_from_the_trace_get_fair_share_figures(tmp_path):
    path = tmp_path / "q.csv"
    assert invoke("generate", "--mix", "philly", "--days", "0.5", "--queue-mix", "alpha=3,beta=1", *SHAPE,
                  "-o", str(path)).exit_code == 0
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - {name: alpha, weight: 1}\n  - {name: beta, weight: 1, guaranteed: {gpu: 32}}\n")
    result = invoke("run", str(path), "--policies", "synapse", "--queues", str(queues))
    assert result.exit_code == 0, result.output
    assert "queues (fair share)" in result.output and "alpha:" in result.output and "jain" in result.output


def test_the_evaluation_queue_file_turns_preemption_on_for_synapse_alone(tmp_path):
    """docs/evaluation-queues.yaml (the evaluation docs' runs with preemption) defines the queue of the
    trace's unqueued jobs: synapse's policy preempts, the baselines never do; without it nobody does."""

    queue_file = paths.ROOT / "docs" / "evaluation-queues.yaml"
    path = tmp_path / "g.csv"
    # seed 4: a trace on which a gang waits long enough to preempt (on seeds 1-3, since gangs split
    # rather than wait for a rack whenever a split would end first, none does)
    assert invoke("generate", "--mix", "gang-heavy", "--days", "1", "--load", "1.0", "--seed", "4", "--nodes", "32",
                  "--racks", "4", "-o", str(path)).exit_code == 0
    runs = {}
    for label, extra in (("off", []), ("on", ["--queues", str(queue_file)])):
        result = invoke("run", str(path), "--policies", "greedy,easy,synapse", "--json", *extra)
        assert result.exit_code == 0, result.output
        runs[label] = json.loads(result.output)["policies"]
    assert runs["on"]["synapse"]["preemptions"] > 0 and runs["on"]["synapse"]["lost_gpu_hours"] > 0
    for policy in ("greedy", "easy"):
        assert runs["on"][policy]["preemptions"] == 0 and runs["on"][policy]["lost_gpu_hours"] == 0
        assert runs["on"][policy]["mean_jct_s"] == runs["off"][policy]["mean_jct_s"]
    assert runs["off"]["synapse"]["preemptions"] == 0
    table = invoke("run", str(path), "--policies", "synapse", "--queues", str(queue_file)).output
    assert "preempt" in table and "lost GPU-h" in table


@pytest.mark.parametrize("args, message", [
    (["run", "{trace}", "--policies", "fifo,lottery"], "unknown policy 'lottery'"),
    (["run", "{missing}"], "cannot read"),
    (["run", "{big}"], "job huge asks for 72 GPUs; the cluster has 64"),
    (["run", "{bad}"], "bad.csv:2: duration_s must not be negative"),
    (["run", "{nocol}"], "missing column(s) gpus"),
    (["run", "{trace}", "--queues", "{missing}"], "cannot read"),
    (["generate", "--mix", "gang-heavy", "--nodes", "8"], "gangs of 256 GPUs; the cluster has 64"),
    (["generate", "--queue-mix", "Bad_Name=1"], "queue name"),
    (["sweep", "--loads", "0.5,x"], "--loads"),
    (["run", "{trace}", "--policies", "synapse", "--tuning", "bogus=1"], "not KEY=VALUE"),
    (["run", "{trace}", "--policies", "synapse", "--tuning", "reservations=x"], "reservations='x' is not a int"),
    (["run", "{trace}", "--policies", "easy", "--tuning", "reservations=1"], "none is chosen"),
    (["run", "{trace}", "--policies", "synapse", "--tuning", "reservations=0"], "at least 1"),
    (["run", "{trace}", "--min-gpus", "65"], "no job asks for 65 GPUs or more"),
    (["run", "{trace}", "--min-gpus", "0"], "--min-gpus"),
    (["import-sacct", "{bad}"], "missing field(s)"),
])
def test_bad_input_gets_one_line_and_no_traceback(tmp_path, trace_file, args, message):
    (tmp_path / "bad.csv").write_text("id,submit_s,gpus,duration_s\na,0,1,-3\n")
    (tmp_path / "nocol.csv").write_text("id,submit_s,duration_s\na,0,3\n")
    (tmp_path / "big.csv").write_text("# cluster: nodes=8 gpus_per_node=8 racks=2\nid,submit_s,gpus,duration_s\n"
                                      "a,0,1,3\nhuge,1,72,3\n")
    paths = {"trace": trace_file, "missing": tmp_path / "nope.csv", "bad": tmp_path / "bad.csv",
             "nocol": tmp_path / "nocol.csv", "big": tmp_path / "big.csv"}
    result = CliRunner().invoke(main, [a.format(**paths) for a in args])
    assert result.exit_code != 0
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    assert message in result.output, result.output


SACCT = """\
JobID|JobName|Submit|Start|End|State|AllocTRES|ReqTRES|NNodes|Timelimit|User
100|train|2024-05-01T10:00:00|2024-05-01T10:05:00|2024-05-01T12:00:00|COMPLETED|cpu=128,gres/gpu=16,node=2|gres/gpu=16|2|04:00:00|alice
100.batch|batch|2024-05-01T10:05:00|2024-05-01T10:05:00|2024-05-01T12:00:00|COMPLETED|cpu=64,gres/gpu=8,node=1||1||
100.0|python|2024-05-01T10:05:00|2024-05-01T10:05:00|2024-05-01T12:00:00|COMPLETED|gres/gpu=16,node=2||2||
101_3|arr|2024-05-01T10:10:00|2024-05-01T10:11:00|2024-05-01T10:20:00|FAILED|cpu=8,gres/gpu:a100=1,node=1||1|1-00:00:00|bob
101_[4-9]|arr|2024-05-01T10:10:00|Unknown|Unknown|PENDING||gres/gpu=1|1|30:00|bob
102|x|2024-05-01T11:00:00|None|2024-05-01T11:30:00|CANCELLED by 1001||gres/gpu=8|1|UNLIMITED|carol
103|cpu|2024-05-01T11:00:00|2024-05-01T11:00:05|2024-05-01T11:10:00|COMPLETED|cpu=4,node=1||1|10|dave
104|run|2024-05-01T11:00:00|2024-05-01T11:00:05|Unknown|RUNNING|gres/gpu=2,node=1||1|60|dave
105|to|2024-05-01T12:00:00|2024-05-01T12:00:05|2024-05-01T13:00:05|TIMEOUT|gres/gpu=3,node=2||2|01:00:00|erin
106|c|2024-05-01T12:00:00|2024-05-01T12:00:05|2024-05-01T12:30:05|CANCELLED by 7|gres/gpu=8,node=1||1|2:00:00|erin
"""


def test_sacct_export_becomes_a_trace():
    trace, skipped = parse_sacct(SACCT)
    by_id = {j.id: j for j in trace.jobs}
    assert sorted(by_id) == ["100", "101_3", "105", "106"]
    assert skipped == {"job steps": 2, "never started": 2, "not ended": 1, "cpu only": 1}
    a = by_id["100"]
    assert (a.submit, a.gpus, a.nodes, a.duration, a.time_limit, a.exit_code, a.user) == \
        (0, 16, 2, 6900, 4 * 3600, 0, "alice")
    assert (by_id["101_3"].submit, by_id["101_3"].gpus, by_id["101_3"].exit_code) == (600, 1, 1)
    assert by_id["101_3"].time_limit == 86400
    assert by_id["105"].gpus == 4 and by_id["105"].nodes == 2  # 3 GPUs over 2 nodes: 2 a node
    assert by_id["106"].exit_code == 1 and by_id["106"].duration == 1800  # cancelled while running


@pytest.mark.parametrize("raw, seconds", [("04:00:00", 14400), ("1-00:00:00", 86400), ("30:00", 1800),
                                          ("10", 600), ("2-12", 2 * 86400 + 12 * 3600), ("UNLIMITED", 0),
                                          ("Partition_Limit", 0), ("1-02:03", 86400 + 2 * 3600 + 180)])
def test_slurm_time_limits(raw, seconds):
    assert parse_timelimit(raw) == seconds


T0 = "200|x|2024-05-01T10:00:00"


@pytest.mark.parametrize("row, message", [
    (T0 + "|yesterday|2024-05-01T12:00:00|COMPLETED|gres/gpu=1||1|10|a", "sacct:3: Start 'yesterday'"),
    (T0 + "|2024-05-01T10:00:00|2024-05-01T12:00:00|WEIRD|gres/gpu=1||1|10|a", "sacct:3: State 'WEIRD'"),
    (T0 + "|2024-05-01T10:00:00|2024-05-01T12:00:00|COMPLETED|gres/gpu=1||one|10|a", "NNodes 'one'"),
    ("200|x|2024-05-01T10:00:00", "sacct:3: 3 field(s), the header has 11"),
    (T0 + "|2024-05-01T13:00:00|2024-05-01T12:00:00|COMPLETED|gres/gpu=1||1|10|a", "out of order"),
    (T0 + "|2024-05-01T10:00:00|2024-05-01T12:00:00|COMPLETED|gres/gpu=1||1|1:2:3:4|a", "Timelimit"),
])
def test_a_malformed_sacct_row_names_its_line(row, message):
    lines = SACCT.splitlines()
    with pytest.raises(TraceError) as err:
        parse_sacct("\n".join([lines[0], lines[1], row]))
    assert message in str(err.value)
