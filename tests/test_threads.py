"""CPU threads (runtime/threads.py, issue 38): the default takes the cores not already busy, an
explicit count wins, and `generate --threads` reaches torch."""

from __future__ import annotations

import os

import pytest
import torch
from typer.testing import CliRunner

from trtllm_dflash.runtime import threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("cores,load,expected", [(2, 0.1, 1), (2, 3.5, 1), (16, 0.0, 16), (16, 4.6, 11), (16, 40.0, 1)])
def test_the_default_takes_the_cores_not_busy(monkeypatch, cores, load, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert threads.default_threads() == expected


def test_an_explicit_count_wins_and_zero_means_the_default(monkeypatch, restore_threads):
    monkeypatch.setattr(threads, "default_threads", lambda: 3)
    assert threads.set_threads(2) == 2 and torch.get_num_threads() == 2
    assert threads.set_threads(0) == 3 and torch.get_num_threads() == 3
    assert threads.set_threads(None) == 3


def test_generate_passes_threads_to_torch(monkeypatch, restore_threads):
    from trtllm_dflash.cli.app import app

    seen = []
    monkeypatch.setattr(threads, "set_threads", lambda count: seen.append(count) or 1)
    result = CliRunner().invoke(app, ["generate", "--target", "demo", "--drafter", "demo", "-p", "def f(x):", "-n", "4", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert seen == [1]
