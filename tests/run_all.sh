#!/usr/bin/env bash
# The one test command:  bash tests/run_all.sh [--quick] [extra pytest args...]
#
# 1. creates a fresh virtual environment ($VENV, default <repo>/.venv-test),
# 2. installs the package with its test extras, pinned by constraints.txt
#    (and, as root, Debian's chromium and chromium-driver for the page tests
#    and redis-server for the rate-limit tests):
#        uv pip install -c constraints.txt -e ".[test]"
#    (uv from PyPI, with pip's settings; pip itself if uv fails:
#        pip install --no-compile -c constraints.txt -e ".[test]"),
# 3. runs the test suite once per Keras backend ($BACKENDS, default
#    "tensorflow jax torch"), the backends side by side (each is mostly
#    single-threaded Python; on 2 cores side by side takes about half the
#    time of one after the other), passing any arguments through to pytest,
# 4. prints each backend's output, its 15 slowest tests, one PASS/FAIL line per
#    backend (with its wall and CPU time), and the line and branch coverage
#    of keras_transformer/, benchmarks/ and training/ over all backends
#    together.
#
# Tests marked `once` (backend-free code, whole-program tests) run in one
# backend's run only, and the TensorFlow and JAX runs record coverage only for
# the `once` tests they collect and the tests that reach their own branches:
# see conftest.py. `--quick` is the development loop: `-m "not slow"`,
# no coverage.
#
# Every backend is run even if one fails; the script exits non-zero if any
# backend failed (pytest's exit code 5, "no tests collected", counts as a
# failure).
#
# Environment variables:
#   VENV=path          virtual environment to use (default: <repo>/.venv-test)
#   BACKENDS="jax torch"   restrict the backends
#   REUSE_VENV=1       keep an existing $VENV instead of recreating it
#                      (pip install still runs; it is quick when nothing changed)
#   PYTHON=python3.11  interpreter used to create the venv (default: python3)
#   INSTALLER=pip      install with pip instead of uv
#   PARALLEL=0         run the backends one after the other, output live
#   COVERAGE=0         no coverage measurement (default: on, except --quick)
#   TF_WORKERS=1       pytest-xdist workers for the TensorFlow run (default 2;
#                      not in --quick)
#   XLA_FLAGS          default --xla_force_host_platform_device_count=4 (4
#                      virtual CPU devices for JAX), XLA's cheapest code
#                      generation and its older fusion emitters, only if not
#                      already set
#   KT_CPU_REPORT=path each test's CPU time, sorted, to path.BACKEND (path.BACKEND.gwN
#                      for TensorFlow's workers): see tests/cpu_report.py
#   TORCHINDUCTOR_VEC_ISA_OK  default 0: torch.compile's scalar kernels (the
#                      cheapest to compile), only if not already set
#   KT_TF_GRAPPLER=1   keep TensorFlow's graph optimizer on in every test
#                      (default 0: off but in the end-to-end and fault tests)
set -euo pipefail

script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd -- "$script_dir/.." && pwd)"
cd "$repo_root"

VENV="${VENV:-$repo_root/.venv-test}"
BACKENDS="${BACKENDS:-tensorflow jax torch}"
PYTHON="${PYTHON:-python3}"
REUSE_VENV="${REUSE_VENV:-0}"
PARALLEL="${PARALLEL:-1}"
COVERAGE="${COVERAGE:-1}"
TF_WORKERS="${TF_WORKERS:-2}"

declare -a pytest_args=()
quick=0
for arg in "$@"; do
    if [[ "$arg" == "--quick" ]]; then
        quick=1
    else
        pytest_args+=("$arg")
    fi
done
if [[ $quick -eq 1 ]]; then
    pytest_args=(-m "not slow" "${pytest_args[@]}")
    COVERAGE=0
fi

if [[ -z "${XLA_FLAGS+x}" ]]; then
    # 4 virtual CPU devices for JAX's data-parallel tests; XLA's cheapest code
    # generation, since the suite's tiny programs spend longer compiling than
    # running (about 15 % of the JAX run's time); and XLA:CPU's older
    # fusion emitters, which compile these programs in about half the time
    # of the newer (MLIR) ones that are its default (TensorFlow's XLA too).
    export XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
fi
# The same trade for torch.compile (the bfloat16 training test): Inductor's
# scalar C++ kernels, which g++ compiles in about two thirds of the time of
# its vectorized ones; users' runs keep Inductor's default.
export TORCHINDUCTOR_VEC_ISA_OK="${TORCHINDUCTOR_VEC_ISA_OK:-0}"
# TensorFlow's functions without Grappler, except in the end-to-end and fault
# tests (see conftest.py: the same trade as XLA's flags above).
export KT_TF_GRAPPLER="${KT_TF_GRAPPLER:-0}"
export TF_CPP_MIN_LOG_LEVEL=2
unset PYTHONDONTWRITEBYTECODE  # see the install below
export MPLBACKEND="${MPLBACKEND:-Agg}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Which backends this run covers: tests marked `once` run in one of them only.
export KT_SUITE_BACKENDS="$BACKENDS"

fmt_duration() {
    local s=$1
    printf '%dm%02ds' $((s / 60)) $((s % 60))
}

# children_cpu: sets $cpu_seconds to the user + system seconds of this
# shell's finished child processes (and theirs), from bash's `times` (which
# must run in this shell: a $(...) subshell has no children yet). On 2 cores
# the suite is bound by CPU time more than by one backend's wall time: the
# summary shows both.
children_cpu() {
    local file="$logs/times.$BASHPID"
    times >"$file"
    cpu_seconds=$(awk 'NR == 2 {
        for (i = 1; i <= 2; i++) { split($i, t, "m"); sub("s", "", t[2]); s += 60 * t[1] + t[2] }
        printf "%d\n", s
    }' "$file")
}
logs="$(mktemp -d)"  # each backend's log, exit code, wall and CPU time
trap 'rm -rf "$logs"' EXIT

# --- 1. virtual environment ------------------------------------------------
install_start=$SECONDS
if [[ "$REUSE_VENV" == "1" && -x "$VENV/bin/python" ]]; then
    echo "==> reusing virtual environment $VENV"
else
    # TensorFlow, JAX and PyTorch take about 4 GiB; pip runs out of space
    # half-way with "[Errno 28] No space left on device". Say so first.
    parent="$(dirname -- "$VENV")"
    mkdir -p -- "$parent"
    free_mib=$(df -Pm -- "$parent" | awk 'NR == 2 { print $4 }')
    if [[ -n "$free_mib" && -d "$VENV" ]]; then  # --clear frees the old one
        free_mib=$((free_mib + $(du -sm -- "$VENV" | cut -f1)))
    fi
    if [[ -n "$free_mib" && "$free_mib" -lt 5120 ]]; then
        echo "not enough disk space for the test environment: ${free_mib} MiB" \
            "free in $parent, about 5 GiB needed (set VENV=path elsewhere)" >&2
        exit 1
    fi
    echo "==> creating fresh virtual environment $VENV (with $PYTHON)"
    "$PYTHON" -m venv --clear "$VENV"
fi
py="$VENV/bin/python"

# --- 2. install --------------------------------------------------------------
# uv (from PyPI) installs the same pins in about a sixth of pip's time: it
# unpacks the wheels in parallel (TensorFlow, JAX and PyTorch are about
# 15,000 files; pip took 1 min 25 s of one core here, uv 15 s). pip's own
# settings on this machine (its local wheel folder and indexes, its
# constraints file) are handed on to uv. If uv cannot be installed or fails,
# pip does the install, as before (INSTALLER=pip forces it).
INSTALLER="${INSTALLER:-uv}"

# pip_settings_for_uv: pip's configured indexes, wheel folders and constraint
# files (pip.conf, PIP_* variables) as uv arguments, one per line.
pip_settings_for_uv() {
    "$py" -m pip config list 2>/dev/null | "$py" -c '
import sys
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint"}
seen = []
for line in sys.stdin:
    key, _, value = line.strip().partition("=")
    flag = flags.get(key.rsplit(".", 1)[-1])
    for item in value.strip("\x27\"").split() if flag else ():
        if (flag, item) not in seen:
            seen.append((flag, item))
            print(flag, item, sep="\n")
'
}

# Quiet, and without pip's notes about this machine's local index folders.
# --no-compile: pip would byte-compile all ~15,000 files of the three
# frameworks, about half of the install's time (2 min 02 s against 1 min 03 s
# here); Python compiles the modules the tests import as it imports them, and
# keeps them: PYTHONDONTWRITEBYTECODE (set on this project's machines) is
# unset above, or every test process would compile TensorFlow, JAX and
# PyTorch from source again (about 11 s of CPU each). uv never compiles.
pip_quiet() {
    "$py" -m pip install --quiet --no-input "$@" 2>&1 |
        grep -v "is ignored: it is neither a file nor a directory"
    return "${PIPESTATUS[0]}"
}

install_with_uv() {
    pip_quiet uv || return 1
    local -a settings=()
    mapfile -t settings < <(pip_settings_for_uv)
    # The cache inside the venv: uv hard-links the installed files from it
    # (same file system), so removing it afterwards frees nothing twice.
    # unsafe-best-match: every index is searched for the pinned version, as
    # pip does (uv's default stops at the first index that has the package).
    local rc=0
    UV_CACHE_DIR="$VENV/.uv-cache" "$VENV/bin/uv" pip install --quiet \
        --python "$py" --index-strategy unsafe-best-match "${settings[@]}" \
        -c constraints.txt -e ".[test]" || rc=$?
    rm -rf -- "$VENV/.uv-cache"
    return "$rc"
}

install_rc=1
if [[ "$INSTALLER" == "uv" ]]; then
    echo "==> uv pip install -c constraints.txt -e \".[test]\" (uv from PyPI)"
    install_with_uv && install_rc=0 || echo "uv failed; installing with pip instead"
fi
if [[ $install_rc -ne 0 ]]; then
    echo "==> pip install --no-compile -c constraints.txt -e \".[test]\""
    install_rc=0
    pip_quiet --no-compile -c constraints.txt -e ".[test]" || install_rc=$?
fi
if [[ $install_rc -ne 0 ]]; then
    echo "install failed (exit $install_rc)"
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
# The page tests drive Debian's chromium through chromium-driver, and the
# rate-limit tests share their limits through Debian's redis-server (system
# packages, not pip's): installed here when missing and this runs as root.
apt_packages=()
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    apt_packages+=(chromium chromium-driver)
fi
if ! command -v redis-server >/dev/null; then
    apt_packages+=(redis-server)
fi
if [[ ${#apt_packages[@]} -gt 0 ]]; then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        echo "==> apt-get install ${apt_packages[*]} (the page tests' browser, the rate-limit tests' Redis)"
        apt_log="$logs/apt.log"
        if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
                "${apt_packages[@]}" >"$apt_log" 2>&1 ||
            { apt-get update -q >>"$apt_log" 2>&1 &&
                DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
                    "${apt_packages[@]}" >>"$apt_log" 2>&1; }; }; then
            tail -n 20 "$apt_log"
            echo "could not install ${apt_packages[*]}; the page or rate-limit tests will fail"
        fi
    else
        echo "==> missing ${apt_packages[*]}, and not root: install Debian's packages"
        echo "    (apt-get install ${apt_packages[*]}); the page or rate-limit tests fail without"
    fi
fi
children_cpu
echo "==> install took $(fmt_duration $((SECONDS - install_start))) (CPU $(fmt_duration "$cpu_seconds"))"

# --- 3. tests, once per backend -----------------------------------------------
rm -f "$repo_root"/.coverage "$repo_root"/.coverage.*

# run_backend BACKEND: pytest on one backend; its exit code and duration go to
# $logs/BACKEND.rc and $logs/BACKEND.took.
run_backend() {
    local backend=$1 start=$SECONDS rc=0 cpu_seconds cpu_start
    children_cpu
    cpu_start=$cpu_seconds
    local -a cov=()
    if [[ "$COVERAGE" == "1" ]]; then
        cov=(--cov=keras_transformer --cov=benchmarks --cov=training --cov-branch
            --cov-report=)
    fi
    # The TensorFlow run is the longest (tracing graphs is slow Python): two
    # pytest-xdist workers, a test file each at a time, so that it uses both
    # cores once the other backends are done.
    local -a workers=()
    if [[ "$backend" == "tensorflow" && "$TF_WORKERS" -gt 1 && $quick -eq 0 ]]; then
        workers=(-n "$TF_WORKERS" --dist loadfile)
    fi
    # Side by side, one OpenMP thread in every run: PyTorch's CPU kernels,
    # and CTranslate2's, which the TensorFlow and JAX runs call too (the
    # references of the Marian and export tests). The runs already keep the
    # cores busy, and OpenMP threads spinning for work slowed PyTorch's run
    # down several times over and doubled the CPU time of the Marian tests
    # in the others. (TensorFlow's and XLA's own thread pools are left as
    # they are: one thread gained nothing measurable.)
    local -a threads=()
    if [[ "$PARALLEL" == "1" ]]; then
        threads=(OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}")
    fi
    # --durations: the slowest tests, to see where the suite's time goes.
    # KT_CPU_REPORT=path: each test's CPU time, to path.BACKEND (tests/cpu_report.py).
    local -a report=()
    if [[ -n "${KT_CPU_REPORT:-}" ]]; then
        report=(KT_CPU_REPORT="$KT_CPU_REPORT.$backend")
    fi
    env "${threads[@]}" "${report[@]}" COVERAGE_FILE="$repo_root/.coverage.$backend" \
        KERAS_BACKEND="$backend" \
        "$py" -m pytest --durations=15 "${workers[@]}" "${cov[@]}" \
        "${pytest_args[@]}" || rc=$?
    echo "$rc" >"$logs/$backend.rc"
    echo "$((SECONDS - start))" >"$logs/$backend.took"
    children_cpu
    echo "$((cpu_seconds - cpu_start))" >"$logs/$backend.cpu"
}

# The frameworks' modules compiled to bytecode once, by one process, before
# the runs start: the venv holds no .pyc files (uv does not compile them), and
# the backends' runs and TensorFlow's workers, all starting at once, would
# each compile the same modules from source (TensorFlow's import took 12.7 s
# of CPU without its .pyc files and 5.2 s with them; JAX's 7.1 and 2.9 s,
# PyTorch's 14.6 and 5.8 s).
warm_start=$SECONDS
children_cpu
warm_cpu=$cpu_seconds
KERAS_BACKEND=torch "$py" -c "import tensorflow, jax, torch, keras_transformer" \
    >/dev/null 2>&1 || echo "(compiling the frameworks' modules failed; the runs will)"
children_cpu
echo "==> the frameworks' modules compiled in $(fmt_duration $((SECONDS - warm_start)))" \
    "(CPU $(fmt_duration $((cpu_seconds - warm_cpu))))"

tests_start=$SECONDS
if [[ "$PARALLEL" == "1" ]]; then
    echo
    echo "==> running the backends side by side: $BACKENDS (output follows each)"
    declare -A pids=()
    for backend in $BACKENDS; do
        run_backend "$backend" >"$logs/$backend.log" 2>&1 &
        pids[$backend]=$!
    done
    for backend in $BACKENDS; do
        wait "${pids[$backend]}" || true
        echo
        echo "==================== KERAS_BACKEND=$backend ===================="
        cat "$logs/$backend.log"
    done
else
    for backend in $BACKENDS; do
        echo
        echo "==================== KERAS_BACKEND=$backend ===================="
        run_backend "$backend"
    done
fi
tests_took=$((SECONDS - tests_start))

# --- 4. summary and coverage ---------------------------------------------------
echo
echo "==================== summary ===================="
if [[ -z "${BACKENDS// /}" ]]; then
    echo "no backends selected (BACKENDS='$BACKENDS')"
    exit 1
fi
failed=0
tests_cpu=0
for backend in $BACKENDS; do
    rc=$(cat "$logs/$backend.rc" 2>/dev/null || echo 99)
    took=$(fmt_duration "$(cat "$logs/$backend.took" 2>/dev/null || echo 0)")
    cpu=$(cat "$logs/$backend.cpu" 2>/dev/null || echo 0)
    tests_cpu=$((tests_cpu + cpu))
    took="$took, CPU $(fmt_duration "$cpu")"
    if [[ $rc -eq 0 ]]; then
        echo "PASS  $backend  ($took)"
    else
        failed=1
        if [[ $rc -eq 5 ]]; then
            echo "FAIL  $backend  ($took, pytest exit 5: no tests collected)"
        else
            echo "FAIL  $backend  ($took, pytest exit $rc)"
        fi
    fi
done
echo "tests took $(fmt_duration $tests_took) in all, CPU $(fmt_duration $tests_cpu) (install: see above)"

if [[ "$COVERAGE" == "1" ]]; then
    echo
    echo "==================== coverage (all backends combined) ===================="
    if ls "$repo_root"/.coverage.* >/dev/null 2>&1; then
        "$py" -m coverage combine --quiet "$repo_root"/.coverage.*
        "$py" -m coverage report --skip-covered --sort=cover || true
        "$py" -m coverage json --quiet -o "$logs/coverage.json"
        "$py" - "$logs/coverage.json" <<'EOF'
import json, sys

t = json.load(open(sys.argv[1]))["totals"]
lines = t["covered_lines"], t["num_statements"]
branches = t["covered_branches"], t["num_branches"]
print(
    f"combined coverage of keras_transformer/, benchmarks/ and training/: "
    f"lines {lines[0]}/{lines[1]} = {100 * lines[0] / lines[1]:.1f} %, "
    f"branches {branches[0]}/{branches[1]} = {100 * branches[0] / branches[1]:.1f} %"
)
EOF
    else
        echo "no coverage data"
    fi
fi
exit "$failed"
