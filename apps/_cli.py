"""What the apps' command lines share: the one-line answer where no GPU is found."""

from __future__ import annotations

import importlib.util
import sys

NO_GPU_STATUS = 2  # the exit status of a GPU-only command without a GPU (as tsm_core.bench)


def gpu_or_exit_status(prog: str) -> int | None:
    """None where a CUDA GPU is usable; else print one line to stderr and return 2.

    Parameters
    ----------
    prog : str
        The command, named in the message.

    Returns
    -------
    int or None
        None when CuPy imports and sees a GPU, else the exit status 2.

    Examples
    --------
    >>> import tsm_core
    >>> from tsm_apps._cli import gpu_or_exit_status
    >>> gpu_or_exit_status("demo") in ((None,) if tsm_core.has_gpu() else (2,))
    True
    """
    from tsm_core.runtime.arrays import has_gpu

    if has_gpu():
        return None
    try:
        found = importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):  # a stand-in None in sys.modules, a broken install
        found = False
    if found:
        why = "no CUDA GPU found"
    else:
        why = "CuPy is not installed (install tsm-toolkit with its cuda12 or cuda13 extra)"
    print(f"{prog}: needs a CUDA GPU: {why}", file=sys.stderr)
    return NO_GPU_STATUS
