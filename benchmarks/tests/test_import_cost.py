"""The import-cost benchmark on one backend, once: the package alone holds
no Keras; Keras alone finds none of the package's classes; in either
order, the two together register them."""

import keras
import pytest

from benchmarks import import_cost

pytestmark = pytest.mark.once


def test_each_case_says_whether_the_classes_are_registered(tmp_path):
    out = tmp_path / "import_cost.json"
    backend = keras.backend.backend()
    results = import_cost.main(
        ["--backends", backend, "--repeats", "1", "--json", str(out)]
    )
    cases = results[backend]
    assert [cases[name]["registered"] for name in import_cost.CASES] == [
        None,
        False,
        True,
        True,
    ]
    assert cases["keras alone"]["package_modules"] == 0
    assert (
        cases["package alone"]["package_modules"]
        < (cases["keras, then the package"]["package_modules"])
    )
    assert all(case["median_seconds"] > 0 for case in cases.values())
    assert out.exists()
