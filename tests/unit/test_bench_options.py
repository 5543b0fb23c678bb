"""``python -m bench``'s size options: a value a scenario cannot run with (a median of no
samples, quantiles of one, a block of one tenant) is argparse's usage error (exit 2, one line
naming the minimum and why), before any cluster is started; the defaults and the smoke test's
tiny sizes still parse."""

from __future__ import annotations

import pytest

from bench.__main__ import build_parser, main
from tests.integration.test_bench_smoke import SCENARIOS as SMOKE

#: (option, the first value refused, what the message says)
TOO_SMALL = [
    ("--fixture-rounds", "1", "must be at least 2 (quantiles need two rounds), not 1"),
    ("--scale-tenants", "19", "must be at least 20 (its blocks are a tenth of them"),
    ("--warm-up", "-1", "must be at least 0 (0 skips the warm-up), not -1"),
    ("--worker-tenants", "1", "must be at least 2 (raw SQL builds half of them per session)"),
    ("--claim-rows", "9", "must be at least 10 (the middle measure is at a tenth of them)"),
    ("--fleet-servers-tenants", "1", "must be at least 2 (half of them go to a tenant server)"),
    ("--fleet-scale-tenants", "9", "must be at least 10 (the upgrade is timed by blocks"),
    ("--rounds", "0", "must be at least 1 (one round at least), not 0"),
    ("--burst-tenants", "0", "must be at least 1"),
    ("--bulk-singles", "0", "must be at least 1"),
    ("--failover-crash-after", "-1", "must be at least 0"),
]


@pytest.mark.parametrize(("option", "value", "message"), TOO_SMALL)
def test_a_too_small_size_is_a_usage_error_before_anything_starts(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([option, value], cluster=None)  # would start a cluster if it got past parsing
    assert exited.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"python -m bench: error: argument {option}: "), err
    assert message in last, err


def test_every_size_option_checks_its_minimum() -> None:
    """No size option is a bare ``type=int`` (which lets 0 through to a division)."""
    sizes = [
        action
        for action in build_parser()._actions
        if action.option_strings and isinstance(action.default, int)
    ]
    assert sizes
    assert all(action.type is not int for action in sizes), [a.dest for a in sizes]


def test_the_defaults_parse_unchanged() -> None:
    args = build_parser().parse_args([])
    assert (args.fixture_rounds, args.scale_tenants, args.rounds, args.warm_up) == (
        60,
        10_000,
        21,
        20,
    )


@pytest.mark.parametrize("scenario", sorted(SMOKE))
def test_the_smoke_tests_tiny_sizes_parse(scenario: str) -> None:
    build_parser().parse_args(SMOKE[scenario][0].split())
