"""`weightcheck.gcpause.GCPaused`, shared by lint's header parsing and the tap's loops: the cyclic collector
off inside, and afterwards exactly as it was (an engine that keeps it off keeps it off)."""

from __future__ import annotations

import gc

import pytest

from weightcheck.gcpause import GCPaused


def test_collector_off_inside_and_back_on_after_even_on_error() -> None:
    assert gc.isenabled()
    with GCPaused():
        assert not gc.isenabled()
        with GCPaused():  # nested: the inner one leaves it off for the outer
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), GCPaused():
        raise ValueError("a loop that fails")
    assert gc.isenabled()


def test_a_collector_kept_off_by_the_caller_stays_off() -> None:
    gc.disable()
    try:
        with GCPaused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
