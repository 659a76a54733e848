"""A real DistributedDataParallel training run on CPU (gloo), as a Synapse gang or under torchrun.

Every rank reads the torch.distributed environment Synapse gives each task (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; torchrun sets the same when it launches the script), trains a small
linear model on its shard of a fixed synthetic dataset, and at the end checks that every rank
holds the same weights (it exits 1 if not). Output, one line per event, `key=value`:

    start rank=0 world_size=2 step=0 resumed=0
    done rank=0 world_size=2 steps=40 loss=0.0123 weights=<sha256 of the weights>

With `--checkpoint DIR` (a directory every rank can read; rank 0 creates it), rank 0 saves the
model and optimizer after every step, and a new run resumes from the last step saved, whatever its
world size: an elastic gang that Synapse restarts larger (or smaller) carries on where it stopped.
`--step-sleep` slows each step down, so that a test can watch a run grow.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16
SAMPLES = 1024


def dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """The same data on every rank: y = x . w_true + noise (fixed seed)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w_true = torch.randn(FEATURES, 1, generator=g)
    return x, x @ w_true + 0.01 * torch.randn(SAMPLES, 1, generator=g)


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--checkpoint", default="", help="directory for a checkpoint after every step")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    checkpoint = Path(args.checkpoint) / "checkpoint.pt" if args.checkpoint else None
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
    if checkpoint is not None and rank == 0:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
    ddp = DistributedDataParallel(model)
    print(f"start rank={rank} world_size={world} step={step} resumed={int(step > 0)}", flush=True)

    x, y = dataset()
    mine = torch.arange(rank, SAMPLES, world)  # this rank's shard
    loss = torch.tensor(0.0)
    while step < args.steps:
        batch = mine[(step * args.batch) % len(mine):][:args.batch]
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(ddp(x[batch]), y[batch])
        loss.backward()  # DDP averages the gradients over every rank
        optimizer.step()
        step += 1
        if checkpoint is not None and rank == 0:
            tmp = checkpoint.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
            os.replace(tmp, checkpoint)  # whole or not at all: a SIGKILL mid-save leaves the last one
        if args.step_sleep:
            time.sleep(args.step_sleep)

    digest = weights_digest(model)
    digests: list[str] = [""] * world
    dist.all_gather_object(digests, digest)
    print(f"done rank={rank} world_size={world} steps={step} loss={loss.item():.4f} weights={digest}", flush=True)
    # No barrier or destroy_process_group: the all_gather above is the last collective, and with
    # Debian's torch 1.13 a rank tearing gloo down while another exits could hang there for good.
    if len(set(digests)) != 1:
        print(f"error rank={rank} weights differ across ranks: {digests}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown too (the process group's destructors): everything is written.
    os._exit(code)
