"""One module per ``specbound`` sub-command; each defines ``HELP``, ``add_arguments(parser)`` and ``run(args)``."""

import json
import os
import tempfile


def check_writable(directory: str, name: str = "--out") -> None:
    """``ValueError`` naming ``name`` when ``directory`` cannot be created or written to (it is created).

    Every command that writes calls it (or :func:`check_writable_file`) before its work starts, so that a long
    run never ends in a traceback about its output path.
    """
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as error:
        raise ValueError(f"{name}: cannot write to {directory}: {error.strerror or error}") from None


def read_json_argument(value, name: str):
    """The JSON an option gives: the contents of the file ``value`` names, or, where there is no such file, the
    text of ``value`` itself when it parses as JSON (``--acceptance '[0.6, 0.15]'`` needs no file).

    ``ValueError`` naming ``name`` for a file that cannot be read or is not JSON, and for a value that is
    neither a file nor JSON.
    """
    path = str(value)
    if not os.path.exists(path):
        try:
            return json.loads(path)
        except json.JSONDecodeError:
            raise ValueError(
                f"{name}: cannot read {path}: no such file, and not inline JSON either"
            ) from None
    try:
        with open(path, encoding="utf-8") as stream:
            return json.load(stream)
    except OSError as error:
        raise ValueError(f"{name}: cannot read {path}: {error.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{name}: {path} is not valid JSON: {error}") from None


def check_writable_file(path: str, name: str) -> None:
    """:func:`check_writable` for the directory of the output file ``path``; also refuses a directory."""
    if os.path.isdir(path):
        raise ValueError(f"{name}: {path} is a directory; give a file name")
    check_writable(os.path.dirname(os.path.abspath(path)), name)


def set_torch_threads(requested: int | None) -> int:
    """Set torch's CPU threads: ``requested``, or the cores this process may run on; returns the count.

    Called by every command that runs a model, so thread use is a deliberate choice, the same for all of them
    (:func:`executor.device.set_threads`).
    """
    from executor.device import set_threads

    return set_threads(requested, name="--threads")


#: ``--dtype`` choices: :data:`executor.device.DTYPE_NAMES`, repeated so that building the parser does not
#: import torch (a test checks that the two agree).
DTYPE_CHOICES = ("auto", "float32", "bfloat16")


def add_dtype_argument(parser) -> None:
    """``--dtype auto|float32|bfloat16`` for a command that runs a model (see :mod:`executor.device`)."""
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="weights and activations: auto (default) = bfloat16 on CUDA and on CPUs with native bfloat16 "
        "(avx512_bf16 or AMX), float32 otherwise",
    )


#: ``--quantize`` choices: :data:`executor.quantize.QUANTIZE_NAMES`, repeated so that building the parser does
#: not import torch (a test checks that the two agree).
QUANTIZE_CHOICES = ("none", "int8", "q4_1")


def add_quantize_argument(parser) -> None:
    """``--quantize none|int8|q4_1`` for a command that runs a model (see :mod:`executor.quantize`)."""
    parser.add_argument(
        "--quantize",
        choices=QUANTIZE_CHOICES,
        default="none",
        help="target weights: none (default, the --dtype floats), int8 (weight-only, per output channel) or "
        "q4_1 (the GGUF file's own Q4_1 blocks, 4-bit kernel); a quantised model is then the target the "
        "decoders are lossless for",
    )


def add_compile_argument(parser) -> None:
    """``--compile``: run the target's layers and LM head through ``torch.compile`` (:mod:`executor.compiled`)."""
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the target's layers and LM head (needs a C++ compiler; else one line and eager); "
        "the compile time is reported apart, Inductor's on-disk cache shortens later runs",
    )


def compile_target(model, token_counts, *, enabled: bool, label: str = "target") -> float | None:
    """With ``enabled``, compile ``model`` and warm it up on ``token_counts`` new tokens; print and return
    the seconds (``None``: not enabled, or the model stayed eager)."""
    if not enabled:
        return None
    import sys

    from executor.compiled import compile_and_warm_up

    seconds = compile_and_warm_up(model, token_counts)
    if seconds is not None:
        print(f"specbound: compiled the {label} in {seconds:.1f} s", file=sys.stderr)
    return seconds
