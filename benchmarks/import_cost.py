"""What importing the package costs, in new processes, per backend: the
package alone (no Keras), Keras alone, Keras then the package (which
registers its classes), and the package then Keras (registered when Keras
arrives), with the modules of this package each ends up holding.

    python -m benchmarks.import_cost [--backends jax torch tensorflow] \\
        [--repeats 5] [--repo PATH] [--json results.json]

``--repo`` puts another checkout first on the path (an older commit, to
compare). Each case runs ``--repeats`` times in a fresh Python, in turns;
reported: the median wall seconds of the import statements alone (measured
inside the process, so the interpreter's own start-up is left out) and
whether ``keras.saving`` then finds ``keras_transformer>Transformer``.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks import REPO

CASES = {
    "package alone": "import keras_transformer",
    "keras alone": "import keras",
    "keras, then the package": "import keras\nimport keras_transformer",
    "the package, then keras": "import keras_transformer\nimport keras",
}

CHILD = """
import json, sys, time
start = time.perf_counter()
{imports}
seconds = time.perf_counter() - start
registered = None
if "keras" in sys.modules:
    registered = (
        keras.saving.get_registered_object("keras_transformer>Transformer") is not None
    )
ours = sum(name.startswith("keras_transformer") for name in sys.modules)
print(json.dumps({{"seconds": seconds, "registered": registered, "modules": ours}}))
"""


def run_case(imports, backend, repo):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = str(repo)
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(imports=imports)],
        env=env,
        cwd=str(repo),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(backends, repeats, repo):
    results = {}
    for backend in backends:
        runs = {name: [] for name in CASES}
        for _ in range(repeats):
            for name, imports in CASES.items():
                runs[name].append(run_case(imports, backend, repo))
        results[backend] = {
            name: {
                "median_seconds": round(
                    statistics.median(r["seconds"] for r in got), 3
                ),
                "registered": got[0]["registered"],
                "package_modules": got[0]["modules"],
            }
            for name, got in runs.items()
        }
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.import_cost")
    parser.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--repo", default=str(REPO))
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    results = measure(args.backends, args.repeats, args.repo)
    for backend, cases in results.items():
        for name, got in cases.items():
            print(
                f"{backend:10} {name:26} {got['median_seconds']:6.3f} s  "
                f"registered={got['registered']}  "
                f"modules of the package: {got['package_modules']}"
            )
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=2)
    return results


if __name__ == "__main__":
    main()
