"""`synapse-local`: a whole cluster on this machine, as separate background processes.

    synapse-local up --masters 3 --workers 4 --racks 2 --gpus-per-worker 8
    synapse-local status
    synapse-local down
    synapse-local demo

TLS is the normal mode: `up` makes a development CA (TLS for the API and the dashboard, mTLS for
the workers); `--insecure` runs in plaintext, for a test that needs it, and says so loudly. The
data dir defaults to an absolute path (`$XDG_STATE_HOME/synapse-local`, else
`~/.local/state/synapse-local`), so `status` and `down` find the cluster from any directory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from synapse.client.master_client import ClientError, ClusterUnavailable, MasterClient
from synapse.common.cli import CONTEXT_SETTINGS, version_option
from synapse.common.datadir import private_umask
from synapse.local import interrupts
from synapse.local.cluster import NETNS_LEDGER, client_env, client_tls, down, load_state, up
from synapse.local.cluster import purge as purge_files
from synapse.local.demo import demo
from synapse.local.netns import MasterNet
from synapse.local.procs import is_alive, is_ours


def default_data_dir() -> Path:
    """Where a local cluster keeps its files unless told otherwise: absolute, the same from any directory."""
    state_home = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state_home):  # unset, or relative: the XDG spec says to ignore it
        state_home = str(Path.home() / ".local" / "state")
    return Path(state_home) / "synapse-local"


DATA_DIR = click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=default_data_dir,
                        show_default="$XDG_STATE_HOME/synapse-local, else ~/.local/state/synapse-local",
                        help="where the cluster keeps its files")


@click.group(context_settings=CONTEXT_SETTINGS)
@version_option("synapse-local")
def main() -> None:
    """Run a Synapse cluster (masters and workers) on this machine."""
    private_umask()  # the cluster's files (config, logs, secrets, history) are this user's alone


@main.command("up")
@DATA_DIR
@click.option("--masters", default=3, show_default=True, help="master replicas: 1, 3 or 5")
@click.option("--workers", default=0, show_default=True, help="worker agents to start")
@click.option("--racks", default=2, show_default=True, help="racks the workers are spread over")
@click.option("--gpus-per-worker", default=8, show_default=True, help="fake GPUs each worker announces")
@click.option("--base-port", default=7000, show_default=True, help="API ports from here, Raft ports from +100")
@click.option("--heartbeat", default=1.0, show_default=True, help="worker heartbeat interval, seconds")
@click.option("--insecure", is_flag=True,
              help="no TLS: plaintext API, dashboard and worker calls (tests of plain mode only)")
@click.option("--tls", is_flag=True, hidden=True, help="TLS is the default; accepted for older scripts")
@click.option("--user-cert", "user_certs", multiple=True,
              help="a client certificate for this user name (repeatable); its CN names the user")
@click.option("--netns", is_flag=True,
              help="each master in its own network namespace and address (root), so `isolate` can cut it off")
@click.option("--history", default="", metavar="URL",
              help="history store: sqlite:////PATH or postgresql+psycopg://USER@HOST/DB; default a SQLite file "
                   "in the data dir; 'none' keeps no history")
@click.option("--spares-per-rack", default=0, show_default=True, type=click.IntRange(min=0),
              help="spare nodes the leader keeps in each rack for gangs that lost a node")
@click.option("--allow-mount", "allow_mounts", multiple=True, metavar="PREFIX",
              help="a host directory jobs in images may mount from, on every worker (repeatable; none by default)")
@click.option("--fresh", is_flag=True,
              help="delete the cluster this data dir holds (its jobs, history and credentials) and start a new one")
@click.pass_context
def up_cmd(ctx: click.Context, data_dir: Path, masters: int, workers: int, racks: int, gpus_per_worker: int,
           base_port: int, heartbeat: float, insecure: bool, tls: bool, user_certs: tuple[str, ...], netns: bool,
           history: str, spares_per_rack: int, allow_mounts: tuple[str, ...], fresh: bool) -> None:
    """Start the cluster in the background (TLS on); returns once every worker is READY.

    In a data dir that holds a stopped cluster, starts that same cluster again (its jobs,
    secrets and workers); options given must then be the ones it was made with (exit 2 if not).
    --fresh deletes it first."""
    if insecure and tls:
        raise click.UsageError("--insecure and --tls contradict each other")
    if insecure:
        _echo("WARNING: --insecure: the API, the dashboard and the workers' calls are plaintext, and anyone "
              "who can reach these ports sees the tokens. Use it only for tests of plain mode.", err=True)
    again = not fresh and (data_dir / "cluster.json").exists()
    with _stopped_on_interrupt(data_dir, "stopping what `up` started"):
        state = up(data_dir, masters, workers, racks, gpus_per_worker, base_port, heartbeat, not insecure,
                   netns=netns, user_certs=user_certs, history=history, spares_per_rack=spares_per_rack,
                   allow_mounts=allow_mounts, fresh=fresh, asked=_given(ctx))
    click.echo(f"local cluster up{' again, as it was' if again else ''}: {len(state['masters'])} master(s), "
               f"{len(state['workers'])} worker(s); files in {state['data_dir']}")
    scheme = "https" if state["ca"] else "http"
    click.echo(f"dashboard: {scheme}://{state['masters'][0]['http_address']}/ (sign in with the token)")
    click.echo("export " + " ".join(f"{k}={v}" for k, v in client_env(state).items()))


#: The settings of `up` (synapse.local.cluster.SETTINGS) that each of its options sets.
_SETTING_OF = {"masters": "masters", "workers": "workers", "racks": "racks", "gpus_per_worker": "gpus",
               "base_port": "base_port", "heartbeat": "heartbeat", "insecure": "tls", "user_certs": "user_certs",
               "netns": "netns", "history": "history", "spares_per_rack": "spares_per_rack",
               "allow_mounts": "allow_mounts"}


def _given(ctx: click.Context) -> set[str]:
    """The settings the command line gave (not left to their defaults): a restarted cluster must match these."""
    return {setting for option, setting in _SETTING_OF.items()
            if ctx.get_parameter_source(option) not in (None, click.core.ParameterSource.DEFAULT)}


@contextmanager
def _stopped_on_interrupt(data_dir: Path, doing: str) -> Iterator[None]:
    """SIGINT, SIGTERM or SIGHUP stops the cluster in `data_dir` and exits with 128 + the signal."""
    with interrupts.handled(doing):
        try:
            yield
        except interrupts.Interrupted as exc:
            if (data_dir / "cluster.json").exists() or (data_dir / NETNS_LEDGER).exists():
                down(data_dir)  # `up` stops what it started itself; this also sweeps the rest
            _echo(f"interrupted by {exc}: stopped everything started in {data_dir.resolve()}", err=True)
            sys.exit(exc.exit_code)


def _echo(text: str, err: bool = False) -> None:
    """click.echo that survives a terminal that has gone (SIGHUP): output must not stop a clean-up."""
    try:
        click.echo(text, err=err)
    except OSError:
        pass


def _net(data_dir: Path) -> MasterNet:
    state = load_state(data_dir.resolve())
    if not state.get("netns"):
        raise click.ClickException("this cluster's masters share loopback; start it with `up --netns`")
    return MasterNet.from_dict(state["netns"])


@main.command("isolate")
@DATA_DIR
@click.argument("replica")
def isolate_cmd(data_dir: Path, replica: str) -> None:
    """Cut master REPLICA off from the other masters (a network partition; clients still reach it)."""
    net = _net(data_dir)
    if replica not in net.replicas:
        raise click.ClickException(f"no master {replica!r}; masters: {', '.join(net.replicas)}")
    net.isolate(replica)
    click.echo(f"{replica} is cut off from {', '.join(r for r in net.replicas if r != replica)}")


@main.command("heal")
@DATA_DIR
def heal_cmd(data_dir: Path) -> None:
    """Undo every `isolate`."""
    _net(data_dir).heal()
    click.echo("the masters can reach each other again")


@main.command("down")
@DATA_DIR
@click.option("--purge", is_flag=True,
              help="also delete the cluster's files: its jobs, history, logs, secrets and certificates")
def down_cmd(data_dir: Path, purge: bool) -> None:
    """Stop every process the cluster in this data dir started, and sweep what a killed run left.

    Besides the processes cluster.json lists, it stops any process marked with this data dir in
    its environment (tasks of a killed worker, say) and removes the network namespaces, bridge and
    veths the data dir's ledger names. The files stay, so `up` starts the same cluster again,
    unless --purge deletes them."""
    data_dir = data_dir.resolve()
    pids = down(data_dir) if not purge or (data_dir / "cluster.json").exists() else []
    click.echo(f"stopped {len(pids)} process(es)")
    if purge:
        removed = purge_files(data_dir)
        click.echo(f"deleted the cluster's files in {data_dir}" if removed else f"no cluster files in {data_dir}")


@main.command("status")
@DATA_DIR
def status_cmd(data_dir: Path) -> None:
    """Which of the cluster's processes are alive, and who leads."""
    data_dir = data_dir.resolve()
    state = load_state(data_dir)
    client = MasterClient([m["api_address"] for m in state["masters"]], state["token"], deadline=3,
                          tls=client_tls(state))
    for m in state["masters"]:
        alive = is_ours(m["pid"], data_dir) and is_alive(m["pid"])
        role = "-"
        if alive:
            try:
                role = client.replica_status(m["api_address"]).state
            except (ClientError, ClusterUnavailable):
                role = "not answering"
        unready = _unready(m["http_address"], state.get("ca", "")) if alive else ""
        click.echo(f"master {m['id']:<4} pid {m['pid']:<8} {'alive' if alive else 'stopped':<8} {role}"
                   + (f"  NOT READY: {unready}" if unready else ""))
    for w in state["workers"]:
        alive = is_ours(w["pid"], data_dir) and is_alive(w["pid"])
        click.echo(f"worker {w['id']:<4} pid {w['pid']:<8} {'alive' if alive else 'stopped':<8} {w['rack']}")
    client.close()


def _unready(http_address: str, ca: str) -> str:
    """The failing checks of a master's /readyz ('' when it is ready or does not answer it)."""
    import urllib.error
    import urllib.request

    from synapse.common.tls import http_base

    base, context = http_base(http_address, ca)
    try:
        with urllib.request.urlopen(f"{base}/readyz?verbose", timeout=3, context=context):
            return ""
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        return "; ".join(line[3:] for line in body.splitlines() if line.startswith("[-]")) or f"HTTP {exc.code}"
    except OSError as exc:
        return f"/readyz: {exc}"


@main.command("demo")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="keep the demo's files here (default: a temporary directory, removed afterwards)")
@click.option("--base-port", default=7300, show_default=True)
def demo_cmd(data_dir: Path | None, base_port: int) -> None:
    """Start a cluster, run a rack-packed gang, kill the leader mid-run, watch it succeed, stop all."""
    import tempfile

    if data_dir is not None:
        with _stopped_on_interrupt(data_dir, "stopping the demo's cluster"):
            ok = demo(data_dir, base_port, say=_echo)
    else:
        with tempfile.TemporaryDirectory(prefix="synapse-demo-") as tmp, \
                _stopped_on_interrupt(Path(tmp), "stopping the demo's cluster"):
            ok = demo(Path(tmp), base_port, say=_echo)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
