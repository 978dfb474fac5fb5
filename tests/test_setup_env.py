"""scripts/setup_cpu_env.sh: one build at a time, published whole, never deleting what it did not make.

These runs make bare venvs (LIGHTONOCR_VENV_BARE=1): the locking, publishing and cleaning
are the same code as for the real ~6 GB environment, which the test command builds anyway.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT

SETUP = str(ROOT / "scripts" / "setup_cpu_env.sh")


def setup(venv: Path) -> subprocess.Popen:
    return subprocess.Popen([SETUP], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LIGHTONOCR_VENV": str(venv), "LIGHTONOCR_VENV_BARE": "1"})


@pytest.mark.slow  # builds virtual environments (~5-15 s each)
def test_two_builds_at_once_make_one_environment(tmp_path: Path):
    venv = tmp_path / "venv-cpu"
    first, second = setup(venv), setup(venv)
    outputs = [run.communicate(timeout=300) for run in (first, second)]
    assert first.returncode == second.returncode == 0, outputs
    # The build itself, not the link: a caller keeps it even if another checkout moves the link.
    assert [out.strip().splitlines()[-1] for out, _ in outputs] == [str(venv.resolve())] * 2
    messages = "".join(err for _, err in outputs)
    assert messages.count("building CPU environment") == 1
    assert "waiting for it" in messages or messages.count("reusing") == 1
    assert venv.is_symlink() and (venv / "bin" / "python").exists() and (venv / ".stamp").exists()
    builds = [p for p in tmp_path.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(builds) == 1 and (builds[0] / ".made-by-lightonocr-bundle").exists()
    # Already built: reused at once.
    again = setup(venv)
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0 and "reusing CPU environment" in err


def test_a_path_it_did_not_make_is_never_deleted(tmp_path: Path):
    venv = tmp_path / "my-own-venv"
    venv.mkdir()
    (venv / "precious.txt").write_text("keep me")
    run = setup(venv)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 1 and "not an environment this script made" in err
    assert (venv / "precious.txt").read_text() == "keep me"


@pytest.mark.slow  # builds virtual environments (~5-15 s each)
def test_an_interrupted_build_is_replaced_but_a_foreign_folder_in_its_place_is_not(tmp_path: Path):
    venv = tmp_path / "venv-cpu"
    run = setup(venv)
    run.communicate(timeout=300)
    build = venv.resolve()
    # Break it like an interrupted build would: the link is gone, the half-built folder is ours.
    venv.unlink()
    (build / "bin" / "python").unlink()
    run = setup(venv)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 0 and "building" in err and (venv / "bin" / "python").exists()
    # Someone else's folder where the build goes: refused, untouched.
    venv.unlink()
    subprocess.run(["rm", "-rf", str(build)], check=True)
    build.mkdir()
    (build / "notes").write_text("not a venv")
    run = setup(venv)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 1 and "is not a build of this script" in err and (build / "notes").exists()


@pytest.mark.slow  # builds virtual environments (~5-15 s each)
def test_a_build_another_checkout_or_a_running_job_uses_is_never_deleted(tmp_path: Path):
    """Two checkouts with different requirements share the machine: each keeps its build, a
    switch back reuses it, and --prune deletes only a build nothing links or runs from."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("requirements-cpu.txt", "requirements-bundle.txt", "requirements-quality.txt",
                 "scripts/setup_cpu_env.sh"):
        (checkout / name).write_bytes((ROOT / name).read_bytes())
    (checkout / "scripts" / "setup_cpu_env.sh").chmod(0o755)
    venv = tmp_path / "venv-cpu"

    def run(*argv: str) -> tuple[str, str]:
        done = subprocess.run([str(checkout / "scripts" / "setup_cpu_env.sh"), *argv], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "LIGHTONOCR_VENV": str(venv), "LIGHTONOCR_VENV_BARE": "1"})
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "", done.stderr

    first, _ = run()
    requirements = checkout / "requirements-bundle.txt"
    original = requirements.read_text()
    requirements.write_text(original + "# another checkout's requirements\n")
    second, err = run()
    assert second != first and Path(first).is_dir() and "1 earlier build(s) kept beside it" in err
    requirements.write_text(original)
    again, err = run()  # switching back reuses the first build, no rebuild
    assert again == first and "building" not in err and venv.resolve() == Path(first)

    job = subprocess.Popen([f"{second}/bin/python", "-c", "import time; time.sleep(60)"])  # a job still running
    try:
        _, err = run("--prune")
        assert f"kept {second} (in use by a running process)" in err and f"kept {first} (linked)" in err
        assert Path(second).is_dir()
    finally:
        job.kill()
        job.wait()
    _, err = run("--prune")
    assert f"deleted {second}" in err and not Path(second).exists() and Path(first).is_dir()
