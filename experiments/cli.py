"""The ``specbound`` command line.

Each sub-command is a module of :mod:`experiments.commands`, imported only when it runs, so that
``specbound bound`` never pays for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import re
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
    parser.add_argument("--version", action="version", version=f"specbound {installed_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"experiments.commands.{module_name}")
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(
            run=module.run, _option_names=option_names(sub, getattr(module, "PARAMETER_OPTIONS", {}))
        )
    return parser


def installed_version() -> str:
    """The installed distribution's version (``unknown`` when run from a source tree that is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("specbound")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def option_names(parser: argparse.ArgumentParser, aliases: dict[str, str]) -> dict[str, str]:
    """Parameter name -> the option a user types: each option's destination (``top_p`` -> ``--top-p``), and
    the command's ``PARAMETER_OPTIONS`` for library parameters named otherwise (``max_budget`` -> ``--budget``)."""
    names = {action.dest: action.option_strings[0] for action in parser._actions if action.option_strings}
    names.pop("help", None)
    return names | aliases


#: The form of the library's argument checks (theory.checks, executor): "top_p must be ...", "acc entries must ...".
_CHECK_MESSAGE = re.compile(r"(?P<name>[a-z_]+)(?P<rest>(?: entries)? must .*)", re.DOTALL)


def naming_the_option(message: str, names: dict[str, str]) -> str:
    """``message`` with a leading library parameter name replaced by the option it came from, so that
    ``specbound plan-tree --budget 0`` says ``--budget must be at least 1`` (not ``max_budget ...``)."""
    match = _CHECK_MESSAGE.fullmatch(message)
    if match is None or match["name"] not in names:
        return message
    return names[match["name"]] + match["rest"]


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
        message = naming_the_option(str(error), args._option_names)
        print(f"specbound {args.command}: error: {message}", file=sys.stderr)
        return 2
    finally:
        if compiled:
            torch.set_flush_denormal(False)


if __name__ == "__main__":
    sys.exit(main())
