"""A stdlib-only AHD-style task for the scoring tests (cheap for the sandbox child to import).

The heuristic ``score(xs)`` receives all instances and returns the objective itself,
unchecked, so tests can hand the sandbox any objective (NaN, a string, ...).
"""


class ToyTask:
    """Instances are floats; the objective is whatever the heuristic returns."""

    minimise = True

    @staticmethod
    def generate_instances(size, n, seed):
        return [float(seed + size * i) for i in range(n)]

    @staticmethod
    def evaluate(heuristic_fn, instances):
        return heuristic_fn(instances)


TOY_TASK = ToyTask()
