"""What a fake nvidia-smi answers: two H100s."""

from __future__ import annotations

SMI_OUTPUT = "0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100 80GB HBM3, 81559\n"
