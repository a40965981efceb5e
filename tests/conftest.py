"""Shared pytest setup: gpusim importable, and fixtures for simulated GPU hosts."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The ansible commands the tests run load this checkout (linked there by scripts/lib.sh),
# never a copy of the collection installed elsewhere.
os.environ['ANSIBLE_COLLECTIONS_PATH'] = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '.build', 'collections')

from gpusim.api import Host  # noqa: E402


@pytest.fixture
def gpuhost_factory(tmp_path):
    """make(name="host", **init_opts) -> an initialised gpusim Host under tmp_path.

    Every host made is stopped at teardown (all its processes SIGKILLed), pass or fail.
    """
    hosts = []

    def make(name="host", **opts):
        host = Host(str(tmp_path / name))
        hosts.append(host)
        host.init(**opts)
        return host

    try:
        yield make
    finally:
        errors = []
        for host in hosts:
            try:
                host.stop()
            except Exception as e:  # keep stopping the other hosts
                errors.append(e)
        if errors:
            raise errors[0]


@pytest.fixture
def gpuhost(gpuhost_factory):
    """A fresh simulated host with the defaults (8 x NVIDIA H200)."""
    return gpuhost_factory()
