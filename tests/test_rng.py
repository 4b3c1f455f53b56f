"""Derived generators: every draw from (seed, purpose, round, client)."""

import numpy as np

from raysim import rng


def test_seeds_of_many_clients_at_once_equal_the_one_at_a_time_derivation():
    """``torch_seeds`` (SeedSequence's hash on arrays) gives each client the seed
    ``torch_generator`` gives it alone, for ids, rounds and seeds over the 32-bit range."""
    cids = np.array([0, 1, 2, 3, 17, 4095, 65536, 99_999, 1_000_000, 2**31 - 1, 2**32 - 1])
    for seed in (0, 1, 12345, 2**32 - 1):
        for purpose, round_ in (("train", 0), ("train", 1), ("eval", 299), ("personalize", 2**31)):
            got = rng.torch_seeds(seed, purpose, round_, cids)
            want = [rng.torch_generator(seed, purpose, round_, int(c)).initial_seed() for c in cids]
            assert got == want
    assert rng.torch_seeds(0, "train", 0, []) == []
