"""One module per ``specbound`` sub-command; each defines ``HELP``, ``add_arguments(parser)`` and ``run(args)``."""


def set_torch_threads(requested: int | None) -> int:
    """Set torch's CPU threads: ``requested``, or the cores this process may run on; returns the count.

    Called by every command that runs a model, so thread use is a deliberate choice, the same for all of them.
    """
    import os

    import torch

    threads = requested if requested is not None else len(os.sched_getaffinity(0))
    if threads < 1:
        raise ValueError(f"--threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)
    return threads
