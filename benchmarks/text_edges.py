"""What the text edges cost a user: the install's size and the start-up of
``kt-translate`` on each backend, and whether a process imports TensorFlow.

    python -m benchmarks.text_edges --venv .venv \\
        --model runs/numbers/translator.keras [--python .venv/bin/python] \\
        [--backends jax torch tensorflow] [--repeats 3]

``--venv``: a virtual environment whose size is measured (``du``), with its
largest packages. Start-up: ``kt-translate --model MODEL seven`` run
``--repeats`` times per backend by ``--python`` (``-m
keras_transformer.cli.translate``, so that another checkout can be measured
with ``--source``), its wall and CPU time (user + system, the process and its
children) as medians; then once more with a ``sitecustomize`` that writes
``sys.modules`` at exit, to list which of TensorFlow, tensorflow-text and
keras-hub it imported (``--repeats 0``: that run's times alone). The
commands point file descriptor 2 away while TensorFlow starts, so
``-X importtime`` would not see it. One JSON line per
measurement on stdout.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

WATCHED = ("tensorflow", "tensorflow_text", "keras_hub")


def directory_size(path):
    """Bytes under ``path`` (files only, links not followed)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return total


def venv_report(venv, top=8):
    """The venv's size and its ``top`` largest entries of site-packages."""
    sites = [
        os.path.join(root, name)
        for root, names, _ in os.walk(os.path.join(venv, "lib"))
        for name in names
        if name == "site-packages"
    ]
    entries = []
    for site in sites:
        for name in os.listdir(site):
            full = os.path.join(site, name)
            if os.path.isdir(full) and not name.endswith((".dist-info", ".data")):
                entries.append((directory_size(full), name))
    entries.sort(reverse=True)
    return {
        "venv": os.path.abspath(venv),
        "bytes": directory_size(venv),
        "largest": {name: size for size, name in entries[:top]},
    }


SITECUSTOMIZE = """
import atexit, json, os, sys

def _write():
    with open(os.environ["KT_MODULES_FILE"], "w") as file:
        json.dump(sorted(sys.modules), file)

atexit.register(_write)
"""


def run_once(python, model, backend, source, modules_file=None):
    env = dict(os.environ, KERAS_BACKEND=backend)
    path = [os.path.abspath(source)] if source else []
    if modules_file:
        folder = os.path.dirname(modules_file)
        with open(os.path.join(folder, "sitecustomize.py"), "w") as file:
            file.write(SITECUSTOMIZE)
        path.insert(0, folder)
        env["KT_MODULES_FILE"] = modules_file
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    command = [python, "-m", "keras_transformer.cli.translate"]
    command += ["--model", os.path.abspath(model), "seven"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # Not from a checkout: ``-m`` puts the working directory first on the
    # path, and a checkout there would be imported instead of ``python``'s.
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir()
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"kt-translate failed on {backend}:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done


def imported(modules):
    """The watched top-level packages among module names."""
    return sorted({name.split(".")[0] for name in modules} & set(WATCHED))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.text_edges")
    parser.add_argument("--venv", help="a virtual environment to measure")
    parser.add_argument("--model", help="a translator.keras for kt-translate")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--source", help="a checkout to import the package from")
    parser.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    results = []
    if args.venv:
        results.append(venv_report(args.venv))
    if args.model:
        for backend in args.backends:
            times = [
                run_once(args.python, args.model, backend, args.source)[:2]
                for _ in range(args.repeats)
            ]
            with tempfile.TemporaryDirectory() as folder:
                modules_file = os.path.join(folder, "modules.json")
                *last, done = run_once(
                    args.python, args.model, backend, args.source, modules_file
                )
                with open(modules_file) as file:
                    modules = json.load(file)
            times = times or [last]
            results.append(
                {
                    "backend": backend,
                    "wall_s": statistics.median(w for w, _ in times),
                    "cpu_s": statistics.median(c for _, c in times),
                    "translation": done.stdout.strip(),
                    "imported": imported(modules),
                }
            )
    for result in results:
        print(json.dumps(result))
    return results


if __name__ == "__main__":
    main()
