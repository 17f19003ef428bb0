"""The README's test command gives the same verdict on every run: Hypothesis draws derandomized
examples and keeps no example database unless a random profile is asked for by name, and every
test starts from the same torch/random state."""

import os
import random

import pytest
import torch
from hypothesis import settings


@pytest.mark.skipif(bool(os.environ.get("HYPOTHESIS_PROFILE")), reason="a profile was asked for by name")
def test_the_default_hypothesis_profile_is_derandomized_without_a_database():
    assert settings.default.derandomize is True
    assert settings.default.database is None


def test_random_profiles_are_opt_in():
    assert settings.get_profile("dev").derandomize is False
    assert settings.get_profile("long").max_examples == 5000


@pytest.mark.parametrize("round_", range(2))
def test_every_test_starts_from_the_same_random_state(round_):
    # the same draw in both rounds: the autouse fixture reseeds before each test
    assert torch.rand(1).item() == pytest.approx(0.49625658988952637)
    assert random.random() == pytest.approx(0.8444218515250481)
