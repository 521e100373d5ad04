"""`bench setup megatron-lm`: the set-up job the reference JUBE definition runs as its `setup_venv` and
`build` steps (Megatron-LM at a commit with the reference's add_tflops_logging.patch, the Python packages,
Apex, the fused kernels), rendered for a system profile and written as one sbatch script."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from nlp_bench.app.doctor import PLACEHOLDERS
from nlp_bench.errors import LaunchError, SpecError
from nlp_bench.fsio import write_text_atomic
from nlp_bench.launch.render import render_setup_script
from nlp_bench.launch.slurm_said import one_line, unauthenticated
from nlp_bench.spec.megatron.translations import reference_table
from nlp_bench.spec.systems import load_system

UPSTREAM = "https://github.com/NVIDIA/Megatron-LM.git"
#: where the reference keeps the patch and Apex, relative to its root
PATCH, APEX = Path("benchmark/aux/add_tflops_logging.patch"), Path("src/apex")
#: what the reference's build step installs with pip before Apex (flash-attn it builds without isolation)
PACKAGES = ("nltk", "sentencepiece", "einops", "mpmath", "ninja")
#: the profile's own time limit is sized for training; building Apex and flash-attn takes about an hour
SETUP_TIME = "02:00:00"
#: as a profile's megatron_lm_repo: a $NAME may expand when the job runs, nothing may run
_PATH = re.compile(r"[A-Za-z0-9_./~${}+,:@-]+")
_COMMIT = re.compile(r"[0-9a-f]{7,40}|[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class SetupJob:
    script: Path
    commit: str
    into: str
    #: the profile's sbatch options still holding a placeholder (the job would be refused)
    placeholders: list[str]


def reference_commit() -> str:
    """The commit the benchmark's reference pins: the one its flag table was generated from."""
    return reference_table().commit


def write_setup(system_name: str, commit: str | None, reference: Path, output: Path, into: str | None,
                url: str, venv: Path | None, packages: list[str] | None, flash_attn: bool, apex: str | None,
                time: str | None) -> SetupJob:
    system = load_system(system_name)
    commit = commit or reference_commit()
    if not _COMMIT.fullmatch(commit):
        raise SpecError(f"--commit {commit!r} is neither a commit hash nor a tag or branch name")
    reference = reference.resolve()
    patch = reference / PATCH
    if not patch.is_file():
        raise SpecError(f"the reference's patch is not at {patch}: give --reference the site's copy of "
                        "github.com/FZJ-JSC/jubench-megatron-lm (its root)")
    into = into or system.megatron_lm_repo
    if not into:
        raise SpecError(f"where should Megatron-LM go? Give --into DIR, or set megatron_lm_repo in "
                        f"slurm/systems/{system.name}.yaml (bench run reads it too)")
    if not _PATH.fullmatch(into):
        raise SpecError(f"--into {into!r}: a path of letters, digits and _./~${{}}+,:@- only")
    expands = "$" in into or into.startswith("~")
    if not expands:
        into = str(Path(into).resolve())  # the job starts in the script's folder, not here
    apex_dir = str(reference / APEX) if apex is None else apex
    wanted = list(PACKAGES if packages is None else packages) + (["flash-attn", "--no-build-isolation"] if flash_attn else [])
    sbatch = {**system.sbatch, "time": time or SETUP_TIME}
    text = render_setup_script(system, commit=commit, into=into, into_expands=expands, url=url, patch=str(patch), apex=apex_dir,
                               venv=str(venv.resolve()) if venv else "", packages=wanted, sbatch=sbatch,
                               script_name=output.name, out_name=f"{output.stem}.out")
    try:
        write_text_atomic(output, text, mode=0o755)
    except OSError as exc:
        raise SpecError(f"cannot write {output}: {exc.strerror or exc}") from None
    left = [f"sbatch.{k}" for k, v in sbatch.items() if any(m in str(v) for m in PLACEHOLDERS)]
    return SetupJob(output, commit, into, left)


def submit_setup(job: SetupJob) -> str:
    """sbatch the script from its folder (its output lands beside it); the job id."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise LaunchError("sbatch not on PATH: load the site's Slurm module, or run the script where Slurm is")
    try:
        done = subprocess.run([sbatch, "--parsable", job.script.name], cwd=job.script.parent, capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"sbatch {job.script} did not answer within 120 s; is the Slurm controller up?") from None
    if done.returncode != 0:
        refused = unauthenticated(done.stderr)
        if refused is not None:
            raise LaunchError(f"Slurm did not answer sbatch {job.script}: {refused}")
        raise LaunchError(f"sbatch {job.script} failed: {one_line(done.stderr) or f'exit {done.returncode}'}")
    return done.stdout.strip().split(";")[0]

