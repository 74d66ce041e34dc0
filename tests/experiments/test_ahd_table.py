"""The matched-baseline table of AHD runs."""

import math

import numpy as np

from experiments import ahd_table


def summary(method, seed, best, task="kp_constructive", minimise=False):
    return dict(task=task, size=50, method=method, seed=seed, minimise=minimise,
                best_eval_objective=best, baseline_eval_objective=20.0)


def test_matched_table_counts_wins_in_the_task_direction():
    runs = [summary("sample", 0, 20.0), summary("sample_es", 0, 21.0),
            summary("sample", 1, 22.0), summary("sample_es", 1, 21.0),
            summary("sample", 2, None), summary("sample_es", 2, 19.0),
            summary("eoh", 0, 5.0, "tsp_constructive", True),
            summary("eoh_es", 0, 4.0, "tsp_constructive", True),
            summary("eoh", 1, 5.0, "tsp_constructive", True),
            summary("eoh_es", 1, 5.0, "tsp_constructive", True)]
    rows = ahd_table.matched_table(runs)
    kp, tsp = rows
    assert (kp["method"], kp["wins"], kp["ties"], kp["losses"]) == ("sample", 2, 0, 1)
    assert kp["without_es"]["mean"] == 21.0 and kp["without_es"]["found"] == 2
    assert math.isclose(kp["with_es"]["std"], np.std([21.0, 21.0, 19.0]))
    assert (tsp["method"], tsp["wins"], tsp["ties"], tsp["losses"]) == ("eoh", 1, 1, 0)
    table = ahd_table.table_markdown(rows)
    assert "| kp_constructive | 50 | max | 20.0000 | sample | 21.0000 ± 1.0000 (2/3) |" in table
    assert table.count("\n") == 4


def test_matched_table_skips_methods_without_their_partner():
    assert ahd_table.matched_table([summary("sample", 0, 1.0), summary("eoh_es", 0, 2.0)]) == []
