"""One module per ``specbound`` sub-command; each defines ``HELP``, ``add_arguments(parser)`` and ``run(args)``."""
