"""``torch_dist_init_method`` values: one handler per URL scheme, looked up in a registry.

A handler (:class:`InitMethod`) is called once in ``Trainer(...)`` to validate and resolve the URL, and once per
rank to prepare the rendezvous and, at exit, to finish it; the doctor's questions are a separate, optional contract
(:class:`RendezvousDiagnostics`). Like ``torch.distributed.rendezvous``, new schemes
plug in with :func:`register_init_method`; the built-in ``env://``, ``tcp://``, ``file://``, ``dir://`` and
``mpi://`` use nothing a registered handler could not.
"""

from lightning_dist_hooks.init_methods._base import (
    LIGHTNING_DEFAULT,
    AddresslessInitMethod,
    InitMethod,
    Rendezvous,
    RendezvousDiagnostics,
    default_init_method_for,
    diagnostics_of,
    init_method_handler,
    prepare_rendezvous,
    register_init_method,
    registered_forms,
    registered_schemes,
    validate_init_method,
)
from lightning_dist_hooks.init_methods._mpi import MpiInitMethod
from lightning_dist_hooks.init_methods._shared_filesystem.claims import FileRendezvous
from lightning_dist_hooks.init_methods._shared_filesystem.dir_scheme import DirInitMethod, DirRendezvous
from lightning_dist_hooks.init_methods._shared_filesystem.directory_store import DirectoryStore, FilesystemOperations
from lightning_dist_hooks.init_methods._shared_filesystem.file_scheme import FileInitMethod, rendezvous_file_for_job
from lightning_dist_hooks.init_methods._shared_filesystem.janitor import Janitor
from lightning_dist_hooks.init_methods._shared_filesystem.launches import launch_identity
from lightning_dist_hooks.init_methods._shared_filesystem.private_files import (
    open_private_directory,
    open_shared_directory,
    private_directory_name,
)
from lightning_dist_hooks.init_methods._store import EnvInitMethod, TcpInitMethod, TCPStoreInitMethod

for _handler in (EnvInitMethod(), TcpInitMethod(), FileInitMethod(), DirInitMethod(), MpiInitMethod()):
    register_init_method(_handler)

__all__ = [
    "LIGHTNING_DEFAULT",
    "AddresslessInitMethod",
    "DirInitMethod",
    "DirRendezvous",
    "DirectoryStore",
    "EnvInitMethod",
    "FileInitMethod",
    "FileRendezvous",
    "FilesystemOperations",
    "InitMethod",
    "Janitor",
    "MpiInitMethod",
    "Rendezvous",
    "RendezvousDiagnostics",
    "TCPStoreInitMethod",
    "TcpInitMethod",
    "default_init_method_for",
    "diagnostics_of",
    "init_method_handler",
    "launch_identity",
    "open_private_directory",
    "open_shared_directory",
    "prepare_rendezvous",
    "private_directory_name",
    "register_init_method",
    "registered_forms",
    "registered_schemes",
    "rendezvous_file_for_job",
    "validate_init_method",
]
