"""Shared vocabulary of cluster/core.py: PD splits as every side reads them."""

from __future__ import annotations

import pytest

from cluster.core import ConfigError, parse_split


def test_splits_parse_to_prefill_and_decode_counts() -> None:
    assert parse_split("4P5D", 9) == (4, 5)
    assert parse_split("1p1d", 2) == (1, 1)
    assert parse_split("collocated", 3) is None


@pytest.mark.parametrize(
    ("split", "nodes", "message"),
    [
        ("4-5", 9, "must look like 4P5D or be 'collocated'"),
        ("0P9D", 9, ">= 1 prefill and >= 1 decode node summing to --nodes 9"),
        ("4P4D", 9, "summing to --nodes 9"),
    ],
)
def test_bad_splits_say_what_is_allowed(split: str, nodes: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_split(split, nodes)


def test_the_simulator_config_path_still_names_the_same_function() -> None:
    from cluster.sim import config

    assert config.parse_split is parse_split
