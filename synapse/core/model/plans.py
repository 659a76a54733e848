"""What the scheduler decides and the workers carry out: a gang's placement (`Plan`), why a gang
does not fit a domain (`Shortfall`), the nodes held for a preemptor (`Hold`), and a task's
assignment to its worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from synapse.core.model.node import Resources

#: A preempted gang's grace when its job file gives none.
DEFAULT_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class Hold:
    """Nodes kept for one preemptor alone while its victims stop (a committed preemption plan)."""

    job_id: str
    attempt: int
    nodes: tuple[str, ...]
    victims: tuple[str, ...]
    rule: str
    at: float


@dataclass(frozen=True, slots=True)
class Placement:
    """Task `index` of a gang runs on `node_id` with these GPU indices and this rank."""

    index: int
    node_id: str
    gpus: tuple[int, ...]
    rank: int


@dataclass(frozen=True, slots=True)
class Plan:
    """A whole gang's placement for one attempt of one job."""

    job_id: str
    attempt: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why a gang does not fit one topology domain."""

    domain: str  #: e.g. `z1/b2/r7`, or `cluster`
    fits: int  #: tasks that fit there now (for domains above racks: at most this many)
    needed: int
    short: tuple[str, ...]  #: resources whose free total is below the gang's need, if any

    def __str__(self) -> str:
        if self.fits >= self.needed:
            return f"{self.domain}: room for {self.fits} task(s), but not packed as the job requires"
        why = ", ".join(self.short) if self.short else "capacity"
        if not self.short:
            why = "whole nodes (free capacity is fragmented)"
        return f"{self.domain}: {self.fits}/{self.needed} tasks fit (short of {why})"


#: The job env variable that gives rank 0 an attachable stdin (`synctl run` sets it): `pipe` (a pipe
#: fed by `synctl run`'s stdin) or `pty` (a pseudo-terminal); any other value, or none, leaves every
#: task's stdin /dev/null. A variable, not a spec field, so it needs no new command-set version; the
#: task sees it too.
STDIN_ENV = "SYNAPSE_STDIN"
STDIN_MODES = ("pipe", "pty")


@dataclass(frozen=True, slots=True)
class Assignment:
    """One task a worker must run (or stop), with everything its process environment needs."""

    job_id: str
    attempt: int
    index: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    gpus: tuple[int, ...]
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    image: str = ""
    stop: bool = False  #: no longer wanted: stop it and report its exit
    grace: float = 0.0  #: with stop: seconds from SIGTERM to SIGKILL; 0 means the worker's default
    resources: Resources = Resources()  #: the task's own; the worker confines it to them
    #: a planned stop is near (while wanted) or this is one (with stop): give the task this signal once,
    #: ahead of SIGTERM (jobspec.NOTICE_SIGNALS spelling); "" = no notice
    notice_signal: str = ""
    notice: float = 0.0  #: with stop and notice_signal: SIGTERM comes this many seconds after the notice
    #: the job's bind mounts (source on the node, target in the image, read-only), for a task in an image
    mounts: tuple[tuple[str, str, bool], ...] = ()
    #: in an image: pull it and report the task prepared, but start it only once a listing says not held
    hold: bool = False

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.job_id, self.attempt, self.index)

    @property
    def stdin_mode(self) -> str:
        """Rank 0's attachable stdin (STDIN_ENV: `pipe` or `pty`); "" for every other task and job."""
        if self.rank != 0:
            return ""
        mode = dict(self.env).get(STDIN_ENV, "")
        return mode if mode in STDIN_MODES else ""
