"""torch's own backends as transports: nothing to register, only what to say where a build lacks one."""

from __future__ import annotations

import torch.distributed as dist
from typing_extensions import override  # a dependency of torch and of Lightning

from lightning_dist_hooks.transports._base import Transport


class NativeTransport(Transport):
    """A backend torch ships (any of them may be missing from a given build: PyPI wheels lack mpi and ucc)."""

    def __init__(self, name: str, install_hint: str, devices: tuple[str, ...] | None = None) -> None:
        self.names = (name,)
        self.install_hint = install_hint
        self.devices = devices

    @override
    def is_available(self) -> bool:
        return dist.is_backend_available(self.names[0])


GLOO = NativeTransport("gloo", "install a torch build with distributed support")
NCCL = NativeTransport(
    "nccl",
    "install a CUDA build of torch and run on NVIDIA GPUs; for CPU training use torch_dist_backend='gloo'",
    devices=("cuda",),
)
UCC = NativeTransport("ucc", "build torch from source with USE_UCC=1, or use torch_dist_backend='gloo'")
XCCL = NativeTransport("xccl", "install an XPU build of torch and run on Intel GPUs")
