"""Checks on what a candidate heuristic returns.

Every evaluator passes the raw return value of the candidate through one of these
checks; anything unusable raises `InvalidHeuristicOutput` with a reason the sandbox
reports back to the search.
"""

import numbers

import numpy as np


class InvalidHeuristicOutput(ValueError):
    """A candidate heuristic returned something the evaluator cannot use.

    Attributes:
        reason: a short human-readable explanation (also the exception message).
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def check_integer(value, what: str) -> int:
    """Returns `value` as an int; raises if it is not an integer (bools are refused)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise InvalidHeuristicOutput(
            f"{what} must be an integer, got {type(value).__name__}: {value!r:.80}")
    return int(value)


def check_real(value, what: str) -> float:
    """Returns `value` as a float; raises for non-numbers, bools and NaN (±inf is kept)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InvalidHeuristicOutput(
            f"{what} must be a real number, got {type(value).__name__}: {value!r:.80}")
    value = float(value)
    if np.isnan(value):
        raise InvalidHeuristicOutput(f"{what} is NaN")
    return value


def check_real_array(value, shape: tuple[int, ...], what: str) -> np.ndarray:
    """Returns `value` as a float64 array of exactly `shape`; raises on anything else."""
    try:
        array = np.asarray(value)
    except Exception as error:  # pylint: disable=broad-except  # arbitrary user objects
        raise InvalidHeuristicOutput(f"{what} is not array-like: {error}") from None
    numeric = np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    if array.dtype == np.bool_ or not numeric:
        raise InvalidHeuristicOutput(
            f"{what} must hold real numbers, got dtype {array.dtype}")
    if array.shape != shape:
        raise InvalidHeuristicOutput(f"{what} must have shape {shape}, got {array.shape}")
    return array.astype(np.float64)


def check_desirability_matrix(value, size: int, what: str = "heuristics output",
                              floor: float = 1e-9) -> np.ndarray:
    """Validates an ACO edge-desirability matrix and rescales it to max 1.

    The diagonal is ignored (an ant never moves from a node to itself) and may hold
    anything. Off-diagonal entries must be finite; the largest must be positive.
    Entries below `floor` times the largest (including zeros and negatives) are raised
    to that floor so that every feasible move keeps a non-zero probability.

    Args:
        value: what the heuristic returned.
        size: the expected side length.
        what: name used in error messages.
        floor: smallest relative desirability kept.

    Returns:
        A (size, size) float64 matrix with off-diagonal entries in [floor, 1] and zeros
        on the diagonal.
    """
    matrix = check_real_array(value, (size, size), what)
    off_diagonal = ~np.eye(size, dtype=bool)
    matrix[~off_diagonal] = 0.0
    entries = matrix[off_diagonal]
    if np.isnan(entries).any():
        raise InvalidHeuristicOutput(f"{what} contains NaN off the diagonal")
    if np.isinf(entries).any():
        raise InvalidHeuristicOutput(f"{what} contains inf off the diagonal")
    largest = entries.max() if entries.size else 1.0
    if largest <= 0:
        raise InvalidHeuristicOutput(
            f"{what} has no positive off-diagonal entry (max {largest})")
    scaled = np.where(off_diagonal, np.maximum(matrix / largest, floor), 0.0)
    return scaled
