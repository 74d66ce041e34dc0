"""Measures of how parameters take updates, shared by bench_precision and
precision_table."""

import jax
import jax.numpy as jnp
import numpy as np

from agentic_esopt import es


def changed_fraction(before, after) -> dict[str, float]:
    """Fraction of entries that differ, over matrix leaves and over vector leaves."""
    counts = {"matrices": [0, 0], "vectors": [0, 0]}
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(before)[0],
                            jax.tree.leaves(after), strict=True):
        kind = "matrices" if es.noise.is_matrix(jax.tree_util.keystr(path), a.shape) \
            else "vectors"
        counts[kind][0] += int(np.sum(np.asarray(a) != np.asarray(b)))
        counts[kind][1] += a.size
    return {kind: changed / total for kind, (changed, total) in counts.items()}


def tree_norm(tree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(leaf ** 2) for leaf in jax.tree.leaves(tree)))


def tree_distance(a, b) -> float:
    """‖a − b‖ over every leaf (float32)."""
    return float(tree_norm(jax.tree.map(
        lambda x, y: jnp.asarray(x, jnp.float32) - jnp.asarray(y, jnp.float32), a, b)))
