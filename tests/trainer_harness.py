"""How the tests start the trainer and read what it printed.

The models here train in well under a second; what cost the trainer tests their time was starting them:
torchrun and each of its ranks imported torch (about 1.6 s of CPU each), and Megatron's default --eval-iters
100 ran a hundred validation batches at the end of every run. So `launch_all` hands a test module's runs to
one launcher process (this file, run as a script) that imports torch and the trainer once and forks each run's
ranks from itself, one run after another, with the environment torchrun would give them; and the model flags
of the tests say --eval-iters 0 unless the test checks evaluation.

`trainer` is `python -m nlp_bench.train` run by hand (a world of one, no launcher); `torchrun` the real
launcher, for what needs a fresh process per rank (torch-xla's runtime) or tests the launch itself.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from nlp_bench.analysis.log_record import Record
from nlp_bench.analysis.parsers import parse_text

#: how long one run may take before the launcher stops it (exit 124, as `timeout` would)
RUN_TIMEOUT_S = 600
#: the MoE model of the trainer's MoE tests: 2 layers, both MoE, 4 experts of width 32, top-2, a shared expert
MOE_MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--ffn-hidden-size", "64",
             "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear", "--seq-length", "16",
             "--train-iters", "3", "--log-interval", "1", "--lr", "3e-3", "--mock-data", "--vocab-size", "200",
             "--distributed-backend", "gloo", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "5",
             "--global-batch-size", "4", "--eval-iters", "0", "--num-experts", "4", "--moe-router-topk", "2",
             "--moe-ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "16", "--moe-layer-freq",
             "([1]*2)"]
_VALIDATION = re.compile(r"validation loss at iteration \d+ \| lm loss value: (\S+) \|")


class Launch(NamedTuple):
    """One run: its ranks, its flags, and what its environment sets (a value None removes the variable)."""

    nproc: int
    flags: Sequence[str]
    env: Mapping[str, str | None] = {}


def launch_all(runs: Mapping[Hashable, Launch], timeout: float = RUN_TIMEOUT_S,
               ) -> dict[Hashable, subprocess.CompletedProcess]:
    """Each run's exit status, stdout and stderr (its ranks' lines together, as torchrun shows them), in the
    order given: a later run may load what an earlier one saved."""
    with tempfile.TemporaryDirectory(prefix="trainer-runs-") as folder:
        spec = Path(folder) / "runs.json"
        spec.write_text(json.dumps([{"nproc": r.nproc, "flags": list(r.flags), "env": dict(r.env), "timeout": timeout}
                                    for r in runs.values()]))
        launcher = subprocess.run([sys.executable, __file__, str(spec)], capture_output=True, text=True,
                                  timeout=timeout * len(runs) + 120)
        out = {}
        for i, (key, run) in enumerate(runs.items()):
            code = Path(folder) / f"{i}.rc"
            assert code.exists(), f"the launcher stopped before run {key!r}: {launcher.stderr[-3000:]}"
            out[key] = subprocess.CompletedProcess(list(run.flags), int(code.read_text()),
                                                   (Path(folder) / f"{i}.out").read_text(),
                                                   (Path(folder) / f"{i}.err").read_text())
    return out


def trainer(*flags: str, env: Mapping[str, str | None] | None = None, timeout: float = RUN_TIMEOUT_S,
            ok: bool = True) -> subprocess.CompletedProcess:
    """`python -m nlp_bench.train FLAGS` as a user runs it by hand: one process, a world of one."""
    proc = subprocess.run([sys.executable, "-m", "nlp_bench.train", *flags], capture_output=True, text=True,
                          timeout=timeout, env=environment(env))
    if ok:
        succeeded(proc)
    return proc


def torchrun(nproc: int, *flags: str, env: Mapping[str, str | None] | None = None, entry: Sequence[str] = (),
             launcher: Sequence[str] = (), timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    """The trainer (or the script `entry`) under the real torchrun, with `launcher`'s options for it."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(nproc), *launcher, *(entry or ["-m", "nlp_bench.train"]), *flags],
                          capture_output=True, text=True, timeout=timeout, env=environment(env))


def environment(changes: Mapping[str, str | None] | None) -> dict[str, str]:
    """This process's environment with `changes` made (a value None removes the variable)."""
    env = dict(os.environ)
    for name, value in (changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def succeeded(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def records(proc: subprocess.CompletedProcess) -> list[Record]:
    """The iteration lines of a run that succeeded."""
    return parse_text(succeeded(proc).stdout)


def losses(proc: subprocess.CompletedProcess) -> list[float]:
    return [r.loss for r in records(proc)]


def validation_losses(text: str) -> list[float]:
    return [float(v) for v in _VALIDATION.findall(text)]


def close(a: Sequence, b: Sequence, rel: float = 1e-5) -> bool:
    """Every number of `a` within `rel` of `b`'s, element by element (numbers or tuples of them)."""
    pairs = [(x, y) for pa, pb in zip(a, b, strict=True)
             for x, y in (zip(pa, pb, strict=True) if isinstance(pa, tuple) else [(pa, pb)])]
    return all(abs(x - y) <= rel * abs(y) for x, y in pairs)


# --- the launcher: this file run as a script -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, nproc: int, port: int, run: dict, out: str, err: str) -> None:
    """One rank of a run in a forked child: torchrun's variables, the run's own, its output to the run's files."""
    import torch

    from nlp_bench.train.trainer import main

    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_APPEND), fd)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    wanted = environment(run["env"])
    os.environ.clear()
    os.environ.update(wanted)
    if nproc > 1 and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # torchrun's default for more than one rank a node
    try:
        code = main(list(run["flags"]))
    except Exception:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.exit(code)


def _launch(run: dict, out: str, err: str) -> int:
    """A run's ranks forked from this process; one that fails stops the others, as torchrun does."""
    import torch.multiprocessing as mp

    for path in (out, err):
        Path(path).write_text("")
    context = mp.start_processes(_rank, args=(run["nproc"], _free_port(), run, out, err), nprocs=run["nproc"],
                                 join=False, start_method="fork")
    deadline = time.monotonic() + run["timeout"]
    try:
        while not context.join(timeout=max(0.0, min(5.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                for process in context.processes:
                    process.kill()
                return 124
    except mp.ProcessExitedException as exc:
        return exc.exit_code if exc.exit_code > 0 else 128 - exc.exit_code
    except mp.ProcessRaisedException as exc:
        with open(err, "a") as stream:
            stream.write(str(exc))
        return 1
    return 0


def _main(spec: str) -> None:
    import nlp_bench.train.trainer  # noqa: F401  (imported once, before the forks)

    folder = Path(spec).parent
    for i, run in enumerate(json.loads(Path(spec).read_text())):
        code = _launch(run, str(folder / f"{i}.out"), str(folder / f"{i}.err"))
        (folder / f"{i}.rc").write_text(str(code))


if __name__ == "__main__":
    _main(sys.argv[1])
