"""The pulls of the images tasks run in: a pool of threads asks the node's image store for each
task's image (one pull per image however many tasks ask); progress and outcome go to the main loop
as events, and the main loop keeps the board of pulls the progress reports read."""

from __future__ import annotations

import logging
import os
import queue
import time
from concurrent import futures
from dataclasses import dataclass

from synapse.core.model import Assignment
from synapse.images.model import PullProgress
from synapse.images.store import ImageStore
from synapse.worker import state as ws
from synapse.worker.runtime import task_id

log = logging.getLogger(__name__)

#: Images pulled at once (the store pulls each image once, however many tasks wait for it).
PULL_THREADS = 4
#: Test hook: seconds each pull of this worker waits before it asks the store (a slow node in a gang).
PULL_DELAY_HOOK = "SYNAPSE_TEST_PULL_DELAY_S"


@dataclass(frozen=True, slots=True)
class PullProgressed:
    """How far a task's image pull is, for the progress thread's reports (I/O bookkeeping, not the
    worker's state: the main loop keeps it on the board of pulls)."""

    key: ws.Key
    progress: PullProgress | None  #: the store's PullProgress; None: the pull began, nothing fetched yet


class Pulls:
    """The node's pulls under way: the pool that runs them and the board of how far each is."""

    def __init__(self, node_id: str, images: ImageStore | None, events: queue.Queue[object]) -> None:
        self.node_id = node_id
        self.images = images  #: the node's image store; None: tasks in images cannot run here
        self.events = events  #: the main loop's queue, where each pull's progress and outcome go
        self.pool = futures.ThreadPoolExecutor(max_workers=PULL_THREADS, thread_name_prefix="pull")
        #: the pulls under way: task key -> the store's latest PullProgress (None before its first);
        #: main loop only (the pull threads send PullProgressed, ImageReady and ImageFailed)
        self.progress: dict[ws.Key, PullProgress | None] = {}
        #: a copy of `progress` for the progress thread, replaced whole by the main loop
        self.board: tuple[tuple[ws.Key, PullProgress | None], ...] = ()
        #: how many pulls have ended (main loop only): the store changed, the next report lists it
        self.ended = 0

    def submit(self, a: Assignment) -> None:
        """(main loop) Get the task's image, on a pull thread."""
        self.pool.submit(self._pull, a)

    def progressed(self, event: PullProgressed) -> None:
        """(main loop) A pull got further: onto the board."""
        self.progress[event.key] = event.progress
        self.board = tuple(self.progress.items())

    def done(self, key: ws.Key) -> None:
        """(main loop) A pull ended: off the board, and the store changed (the next report lists it)."""
        self.progress.pop(key, None)
        self.board = tuple(self.progress.items())
        self.ended += 1

    def _pull(self, a: Assignment) -> None:
        """(pull thread) Get the task's image from the store, pinned for the task; the outcome goes
        to the main loop as an event."""
        if self.images is None:
            self.events.put(ws.ImageFailed(a.key, f"node {self.node_id} has no image store", True))
            return
        self.events.put(PullProgressed(a.key, None))
        try:
            delay = float(os.environ.get(PULL_DELAY_HOOK, "") or 0)
            if delay > 0:
                time.sleep(delay)
            image = self.images.ensure(a.image, holder=task_id(a),
                                       progress=lambda p: self.events.put(PullProgressed(a.key, p)))
        except Exception as exc:  # the store's PullError, or anything else it raised: the task must end
            cause = getattr(exc, "cause", "")
            node_side = bool(getattr(exc, "node_side", True))
            log.warning("image pull failed task=%s image=%s cause=%s node_side=%s error=%s", a.key, a.image,
                        cause or type(exc).__name__, node_side, exc)
            self.events.put(ws.ImageFailed(a.key, f"node {self.node_id}: image {a.image}: "
                                                  f"{cause or type(exc).__name__}: {getattr(exc, 'message', exc)}",
                                           node_side))
            return
        self.events.put(ws.ImageReady(a.key, image))
