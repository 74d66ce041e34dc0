"""Sharded noise and updates equal unsharded ones and keep their shardings (8 CPU devices)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from agentic_esopt import es


def fsdp_shard(params, mesh):
    def place(leaf):
        spec = P("fsdp") if leaf.shape[0] % mesh.size == 0 else P()
        return jax.device_put(leaf, NamedSharding(mesh, spec))
    return jax.tree.map(place, params)


@pytest.mark.parametrize("noise", ["full", "lowrank"])
def test_sharded_equals_unsharded(noise):
    assert jax.device_count() == 8
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    key = jax.random.key(1)
    params = {"embed": {"embedding": jax.random.normal(key, (64, 24))},
              "layers": {"kernel": jax.random.normal(key, (8, 24, 16))},
              "norm": {"scale": jnp.ones(24)}}
    sharded = fsdp_shard(params, mesh)
    strategy = es.agentic_esopt(6, 0.1, 0.1, noise=noise, rank=2 if noise == "lowrank" else 1,
                                antithetic=True)
    rewards = np.arange(6.0)
    results = []
    for tree in (params, sharded):
        state = strategy.init(0, jax.tree.map(jnp.copy, tree))  # tell consumes it.
        population = strategy.ask(state)
        perturbed = strategy.perturb(state, population, 3)
        new_state, _ = strategy.tell(state, population, rewards)
        results.append((perturbed, new_state.params))
    for plain, split in zip(jax.tree.leaves(results[0][0]), jax.tree.leaves(results[1][0])):
        np.testing.assert_array_equal(np.asarray(plain), np.asarray(split))
    for plain, split in zip(jax.tree.leaves(results[0][1]), jax.tree.leaves(results[1][1])):
        if noise == "full":
            np.testing.assert_array_equal(np.asarray(plain), np.asarray(split))
        else:  # The low-rank update is a matmul: its reduction order follows the shard shape.
            np.testing.assert_allclose(np.asarray(plain), np.asarray(split), rtol=2e-6,
                                       atol=1e-7)
    for original, (perturbed, updated) in zip(
            jax.tree.leaves(sharded), zip(jax.tree.leaves(results[1][0]),
                                          jax.tree.leaves(results[1][1]))):
        assert perturbed.sharding.is_equivalent_to(original.sharding, original.ndim)
        assert updated.sharding.is_equivalent_to(original.sharding, original.ndim)
    assert results[1][1]["embed"]["embedding"].sharding.spec == P("fsdp")
