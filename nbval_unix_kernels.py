"""nbval's chapter kernels listen on Unix sockets (a pytest plugin: ``-p nbval_unix_kernels``).

nbval starts a chapter's kernel with jupyter_client's default transport, TCP, on five ports
that jupyter_client finds by binding port 0 and closing the socket; the kernel binds them a
moment later. Between the two, another process may take one of them (three xdist workers start
kernels, compilers, browsers and servers at once), and then the kernel exits at startup and
every cell of that chapter errors with "Kernel died before replying to kernel_info". Unix
sockets are files named after the kernel, so no other process can hold the address a kernel is
told to bind.

A plugin module, not a ``book/conftest.py``: the tests import their own ``conftest`` by name,
and a second module of that name would take its place in ``sys.modules``.
"""

from __future__ import annotations

import os
import tempfile
import uuid

import nbval.kernel
from jupyter_client.manager import KernelManager


class UnixSocketKernelManager(KernelManager):
    """A KernelManager whose kernel listens on Unix sockets in the temp directory, not TCP ports.

    The five sockets are ``<ip>-1`` ... ``<ip>-5`` with ``ip`` a fresh name under
    :func:`tempfile.gettempdir` (short, so the paths stay under the 107-byte limit of a Unix
    socket address); jupyter_client removes them when the kernel shuts down.
    """

    def __init__(self, **kwargs: object) -> None:
        name = f"nbval-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        kwargs.setdefault("transport", "ipc")
        kwargs.setdefault("ip", os.path.join(tempfile.gettempdir(), name))
        super().__init__(**kwargs)


# nbval.kernel.start_new_kernel looks the class up in its module when it starts each kernel;
# if a later nbval no longer does, say so rather than run every chapter on TCP unnoticed
_named = getattr(nbval.kernel, "KernelManager", None)
if not (isinstance(_named, type) and issubclass(_named, KernelManager)):
    raise ImportError("nbval.kernel no longer names jupyter_client's KernelManager: "
                      "nbval_unix_kernels cannot give its kernels Unix sockets")
nbval.kernel.KernelManager = UnixSocketKernelManager
