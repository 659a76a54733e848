"""GPU discovery: how many GPUs this machine has, their model and memory.

NVML (the `nvidia-ml-py` package, imported as `pynvml`, when it is installed and a driver answers)
first, else `nvidia-smi --query-gpu`. The model becomes the node's `gpu_model` label (`H100` from
"NVIDIA H100 80GB HBM3"), which job files select with `gpu_model: H100`; `gpu_product` keeps the
full name and `gpu_memory` each GPU's memory.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from dataclasses import dataclass

log = logging.getLogger(__name__)

QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]
#: Words of a product name that say who made it or its product line, not which GPU it is.
_VENDOR = {"nvidia", "tesla", "geforce", "quadro"}
#: Words that describe a variant (memory size, form factor, memory type), after the model.
_VARIANT = re.compile(r"^(\d+gb|sxm\d*|pcie|hbm\d*e?|nvl|mig.*)$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class GPU:
    index: int
    name: str  #: the product name, e.g. "NVIDIA H100 80GB HBM3"
    memory: int  #: bytes


def short_model(name: str) -> str:
    """The model of a product name: "NVIDIA H100 80GB HBM3" -> H100, "NVIDIA A100-SXM4-80GB" -> A100,
    "NVIDIA GeForce RTX 4090" -> RTX-4090."""
    words = [w for w in re.split(r"[\s-]+", name.strip()) if w and w.lower() not in _VENDOR]
    kept: list[str] = []
    for word in words:
        if _VARIANT.match(word):
            break
        kept.append(word)
    return "-".join(kept or words[:1])


def parse_nvidia_smi(text: str) -> list[GPU]:
    """GPUs from `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits`."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        try:
            memory = int(float(parts[-1])) << 20  # MiB
        except ValueError:
            memory = 0
        out.append(GPU(int(parts[0]), ",".join(parts[1:-1]), memory))
    return out


def _from_nvml() -> list[GPU] | None:
    try:
        import pynvml  # nvidia-ml-py, optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver
        return None
    try:
        gpus = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            gpus.append(GPU(i, name, int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)))
        return gpus
    except Exception as exc:  # noqa: BLE001 - a driver error: try nvidia-smi
        log.warning("NVML query failed error=%s", exc)
        return None
    finally:
        pynvml.nvmlShutdown()


def _from_nvidia_smi() -> list[GPU] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        run = subprocess.run(QUERY, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvidia-smi failed error=%s", exc)
        return None
    if run.returncode != 0:
        log.warning("nvidia-smi failed code=%d output=%s", run.returncode, (run.stdout + run.stderr).strip()[:200])
        return None
    return parse_nvidia_smi(run.stdout)


def discover() -> tuple[list[GPU], str]:
    """This machine's GPUs and where they were learned from ("nvml", "nvidia-smi" or "none")."""
    for source, probe in (("nvml", _from_nvml), ("nvidia-smi", _from_nvidia_smi)):
        gpus = probe()
        if gpus is not None:
            return gpus, source
    return [], "none"


def _memory_label(memory: int) -> str:
    gib = round(memory / (1 << 30))
    return f"{gib}Gi" if gib >= 1 else f"{memory >> 20}Mi"


def labels_for(gpus: list[GPU]) -> dict[str, str]:
    """The node labels GPUs give: gpu_model, gpu_product and gpu_memory (of the first GPU; a mix of
    models is logged, and the first one named)."""
    if not gpus:
        return {}
    names = sorted({g.name for g in gpus})
    if len(names) > 1:
        log.warning("GPUs of several models on one node models=%s; labelling it with the first", ",".join(names))
    first = gpus[0]
    return {"gpu_model": short_model(first.name), "gpu_product": re.sub(r"\s+", "-", first.name.strip())[:63],
            "gpu_memory": _memory_label(first.memory)}
