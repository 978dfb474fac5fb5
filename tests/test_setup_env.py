"""scripts/setup_cpu_env.sh: one build at a time, published whole, never deleting what it did not make.

These runs make bare venvs (LIGHTONOCR_VENV_BARE=1): the locking, publishing and cleaning
are the same code as for the real ~6 GB environment, which the test command builds anyway.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers import ROOT

SETUP = str(ROOT / "scripts" / "setup_cpu_env.sh")


def setup(venv: Path) -> subprocess.Popen:
    return subprocess.Popen([SETUP], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LIGHTONOCR_VENV": str(venv), "LIGHTONOCR_VENV_BARE": "1"})


def test_two_builds_at_once_make_one_environment(tmp_path: Path):
    venv = tmp_path / "venv-cpu"
    first, second = setup(venv), setup(venv)
    outputs = [run.communicate(timeout=300) for run in (first, second)]
    assert first.returncode == second.returncode == 0, outputs
    assert [out.strip().splitlines()[-1] for out, _ in outputs] == [str(venv)] * 2
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
