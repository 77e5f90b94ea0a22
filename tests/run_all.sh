#!/usr/bin/env bash
# The one test command:  bash tests/run_all.sh [extra pytest args...]
#
# 1. creates a fresh virtual environment ($VENV, default <repo>/.venv-test),
# 2. installs the package with its test extras, pinned by constraints.txt:
#        pip install -c constraints.txt -e ".[test]"
# 3. runs the whole test suite once per Keras backend ($BACKENDS, default
#    "tensorflow jax torch"), passing any arguments through to pytest.
#
# Every backend is run even if an earlier one fails; the script exits non-zero
# if any backend failed (pytest's exit code 5, "no tests collected", counts as
# a failure).
#
# Environment variables:
#   VENV=path          virtual environment to use (default: <repo>/.venv-test)
#   BACKENDS="jax torch"   restrict the backends
#   REUSE_VENV=1       keep an existing $VENV instead of recreating it
#                      (pip install still runs; it is quick when nothing changed)
#   PYTHON=python3.11  interpreter used to create the venv (default: python3)
#   XLA_FLAGS          default --xla_force_host_platform_device_count=4
#                      (4 virtual CPU devices for JAX), only if not already set
#   KT_NOTEBOOK_BACKENDS=tensorflow   backends whose run executes the notebooks
set -euo pipefail

script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd -- "$script_dir/.." && pwd)"
cd "$repo_root"

VENV="${VENV:-$repo_root/.venv-test}"
BACKENDS="${BACKENDS:-tensorflow jax torch}"
PYTHON="${PYTHON:-python3}"
REUSE_VENV="${REUSE_VENV:-0}"

if [[ -z "${XLA_FLAGS+x}" ]]; then
    export XLA_FLAGS="--xla_force_host_platform_device_count=4"
fi
export TF_CPP_MIN_LOG_LEVEL=2
export MPLBACKEND="${MPLBACKEND:-Agg}"
# Execute the notebooks in one backend's run only (the fastest for them),
# for the suite's time budget; tests/test_notebooks.py explains.
export KT_NOTEBOOK_BACKENDS="${KT_NOTEBOOK_BACKENDS:-tensorflow}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

fmt_duration() {
    local s=$1
    printf '%dm%02ds' $((s / 60)) $((s % 60))
}

# --- 1. virtual environment ------------------------------------------------
install_start=$SECONDS
if [[ "$REUSE_VENV" == "1" && -x "$VENV/bin/python" ]]; then
    echo "==> reusing virtual environment $VENV"
else
    echo "==> creating fresh virtual environment $VENV (with $PYTHON)"
    "$PYTHON" -m venv --clear "$VENV"
fi
py="$VENV/bin/python"

# --- 2. install --------------------------------------------------------------
echo "==> pip install -c constraints.txt -e \".[test]\""
# Quiet, and without pip's notes about this machine's local index folders.
set +e
"$py" -m pip install --quiet --no-input -c constraints.txt -e ".[test]" 2>&1 |
    grep -v "is ignored: it is neither a file nor a directory"
pip_rc=${PIPESTATUS[0]}
set -e
if [[ $pip_rc -ne 0 ]]; then
    echo "pip install failed (exit $pip_rc)"
    exit 1
fi
"$py" - <<'EOF'
import importlib.metadata as md
for name in ("keras", "tensorflow", "jax", "torch", "keras-hub", "numpy"):
    try:
        print(f"    {name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(f"    {name}: not installed")
EOF
echo "==> install took $(fmt_duration $((SECONDS - install_start)))"

# --- 3. tests, once per backend -----------------------------------------------
declare -a summary=()
failed=0
for backend in $BACKENDS; do
    echo
    echo "==================== KERAS_BACKEND=$backend ===================="
    start=$SECONDS
    rc=0
    # --durations: the slowest tests, to see where the suite's time goes.
    KERAS_BACKEND="$backend" "$py" -m pytest --durations=15 "$@" || rc=$?
    took=$(fmt_duration $((SECONDS - start)))
    if [[ $rc -eq 0 ]]; then
        summary+=("PASS  $backend  ($took)")
    else
        failed=1
        if [[ $rc -eq 5 ]]; then
            summary+=("FAIL  $backend  ($took, pytest exit 5: no tests collected)")
        else
            summary+=("FAIL  $backend  ($took, pytest exit $rc)")
        fi
    fi
done

echo
echo "==================== summary ===================="
if [[ ${#summary[@]} -eq 0 ]]; then
    echo "no backends selected (BACKENDS='$BACKENDS')"
    exit 1
fi
for line in "${summary[@]}"; do
    echo "$line"
done
exit "$failed"
