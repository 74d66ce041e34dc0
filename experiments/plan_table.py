"""The results page's table of plans, rebuilt from their JSON rows.

    python -m experiments.plan_table [experiments/results/plan]

Prints one markdown row per ``*.json`` (``experiments.plan --json`` with its ``command``),
sorted by file name: the table under "Rows" in ``docs/results/plan.md``.
"""

import glob
import json
import os
import sys

FOLDER = "experiments/results/plan"
HEADER = ("| row | rule | target | mesh | per device (GiB) of HBM | fits | s / generation "
          "| largest program | command |\n|---|---|---|---|---|---|---|---|---|")


def _largest(result: dict) -> str:
    """The program that sets the per-device figure (a refused one: the compiler's)."""
    error = result.get("compile_error")
    if error:
        function = error.split(": ")[0]
        named = "" if function == "RESOURCE_EXHAUSTED" else f"{function}, "
        return f"{named}refused by XLA:TPU (out of HBM)"
    return max(result["programs"], key=lambda p: p["per_device_bytes"])["name"]


def _seconds(result: dict) -> str:
    seconds = result["seconds_per_generation"]
    return "-" if result.get("compile_error") or seconds is None else f"{seconds:.0f}"


def row(name: str, result: dict) -> str:
    """One plan as a markdown row."""
    memory = (f"{result['per_device_bytes'] / 2**30:.2f} of "
              f"{result['device_memory_bytes'] / 2**30:g}")
    cells = [name, f"{result['rule']} ({result['dtype']})", result["target"], str(result["mesh"]), memory,
             "yes" if result["fits"] else "no", _seconds(result), _largest(result),
             f"`{result['command']}`"]
    return "| " + " | ".join(cells) + " |"


def table(folder: str = FOLDER) -> str:
    """Every row of ``folder`` under the header."""
    rows = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as file:
            rows.append(row(os.path.basename(path)[:-len(".json")], json.load(file)))
    return "\n".join([HEADER, *rows])


if __name__ == "__main__":
    print(table(*sys.argv[1:]))
