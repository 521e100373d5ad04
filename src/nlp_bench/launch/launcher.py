"""The launcher interface: how a jobscript finds its rendezvous host and starts torchrun on each of its
nodes, and the registry that finds a launcher by the name a system profile gives (`launcher:`). A launcher
is a class in any module of launch/, marked @register_launcher (see nlp_bench.registry for why); the
jobscript template writes what it answers and never asks which launcher it is."""

from __future__ import annotations

from typing import Protocol

from nlp_bench.errors import LaunchError
from nlp_bench.registry import Registry
from nlp_bench.spec.systems import System


class Launcher(Protocol):
    name: str
    #: what comes before the `bash -c "$LAUNCH" ...` line that starts torchrun ("": in the job's own shell);
    #: it may end in a continued line
    start: str
    #: the shell command the hang watchdog ends a stuck job with
    stop: str

    def rendezvous(self, system: System) -> str:
        """The shell lines that export MASTER_ADDR, the host of torchrun's rendezvous store."""


#: every launcher, by the name profiles give it
LAUNCHERS: Registry[type] = Registry("launcher", "nlp_bench.launch", LaunchError)


def register_launcher(cls: type) -> type:
    """Class decorator: the launcher answers to its `name` in system profiles."""
    return LAUNCHERS.add(cls.name, cls)


def launcher_for(system: System) -> Launcher:
    """The launcher a system profile names; an unknown name is refused naming the profile's file."""
    return LAUNCHERS.get(system.launcher, system.profile_path or f"system {system.name}")()
