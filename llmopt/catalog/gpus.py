"""The GPU catalogue: what the planner needs to know about a target GPU.

``memory_gib`` is the memory the CUDA driver reports as total (a little below the
marketing figure); ``bandwidth_gbs`` is the vendor's peak memory bandwidth in GB/s;
``cc`` is the CUDA compute capability. Facts from the vendors' data sheets.
``gpus_per_node`` is the most GPUs of the kind one node (machine) holds: 8 for the
SXM boards (an HGX / DGX board holds 8) and for the PCIe and consumer cards (8 in
the largest common servers: AWS g5.48xlarge with 8 A10G, g6.48xlarge with 8 L4,
8-slot L40S / RTX servers); a recipe's ``[target] count`` is at most this.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass

from llmopt.errors import UsageError


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    cc: tuple[int, int]
    bandwidth_gbs: float
    arch: str
    aliases: tuple[str, ...] = ()
    gpus_per_node: int = 8

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def cc_str(self) -> str:
        return f"{self.cc[0]}.{self.cc[1]}"

    def to_dict(self) -> dict:
        out = asdict(self)
        out["cc"] = self.cc_str
        return out


CATALOG: tuple[GPU, ...] = (
    GPU("T4", 14.6, (7, 5), 320, "Turing"),
    GPU("A10G", 22.0, (8, 6), 600, "Ampere"),
    GPU("A100-40GB", 39.4, (8, 0), 1555, "Ampere", ("A100-SXM-40GB", "A100-PCIE-40GB")),
    GPU("A100-80GB", 79.2, (8, 0), 2039, "Ampere", ("A100-SXM-80GB", "A100")),
    GPU("L4", 22.0, (8, 9), 300, "Ada"),
    GPU("L40S", 44.4, (8, 9), 864, "Ada"),
    GPU("RTX-4090", 23.6, (8, 9), 1008, "Ada", ("RTX4090", "4090")),
    GPU("H100-SXM-80GB", 79.2, (9, 0), 3350, "Hopper", ("H100-SXM", "H100")),
    GPU("H100-PCIe-80GB", 79.2, (9, 0), 2000, "Hopper", ("H100-PCIE", "H100-PCIe")),
    GPU("H200", 139.8, (9, 0), 4800, "Hopper", ("H200-SXM-141GB", "H200-141GB")),
    GPU("B200", 178.4, (10, 0), 8000, "Blackwell", ("B200-SXM-180GB",)),
    GPU("RTX-5090", 31.4, (12, 0), 1792, "Blackwell", ("RTX5090", "5090")),
)


def _key(name: str) -> str:
    return name.lower().replace("_", "-").replace(" ", "-")


_BY_NAME = {_key(alias): gpu for gpu in CATALOG for alias in (gpu.name, *gpu.aliases)}


def find_gpu(name: str) -> GPU | None:
    return _BY_NAME.get(_key(name))


def get_gpu(name: str, where: str = "") -> GPU:
    gpu = find_gpu(name)
    if gpu is None:
        valid = [g.name for g in CATALOG]
        close = difflib.get_close_matches(name, valid + [a for g in CATALOG for a in g.aliases], n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(
            f"unknown GPU {name!r}",
            where=where,
            fix=f"{hint}choose one of: {', '.join(valid)} (`llmopt ls gpus`)",
        )
    return gpu
