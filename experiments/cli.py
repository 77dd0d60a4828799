"""The ``specbound`` command line.

Each sub-command is a module of :mod:`experiments.commands`, imported only when it runs, so that
``specbound bound`` never pays for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: sub-command name -> module under experiments.commands
COMMANDS = {
    "validate": "validate",
    "bound": "bound",
    "plan-length": "plan_length",
    "plan-tree": "plan_tree",
    "generate": "generate",
    "convert-log": "convert_log",
    "profile": "profile",
    "train-drafter": "train_drafter",
    "bench": "bench",
    "methods": "methods",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specbound",
        description="Exact bounds and a reference executor for speculative decoding.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"experiments.commands.{module_name}")
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    compiled = bool(getattr(args, "compile", False))
    if compiled:
        # Inductor's CPU kernels run 5-50x slower on subnormal floats, which SmolLM2's forward produces at some
        # contexts (0.5-3.3 s instead of 60-120 ms a forward), where eager BLAS flushes them. Flushing them to
        # zero must happen before torch starts its worker threads, which copy the setting: here, first thing.
        import torch

        torch.set_flush_denormal(True)
    try:
        return int(args.run(args) or 0)
    except ValueError as error:
        print(f"specbound {args.command}: error: {error}", file=sys.stderr)
        return 2
    finally:
        if compiled:
            torch.set_flush_denormal(False)


if __name__ == "__main__":
    sys.exit(main())
