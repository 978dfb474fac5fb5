"""start_optimized.sh / stop_optimized.sh with real processes on the CPU backend."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import gradio as gr
import pytest
import requests

from ocr_bundle.page import OcrPage
from conftest import TEST_MAX_MODEL_LEN
from helpers import PYTHON, ROOT, free_port, wait_for
from ocr_bundle.client import OcrClient, OcrError
from ocr_bundle.images import prepare_image_bytes
from ocr_bundle.serve.processes import Service, proc_info, read_pid_file
from ocr_bundle.samples import sample_path


def script(name: str, env: dict[str, str], *argv: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / name), *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **env})


@pytest.fixture()
def lifecycle_env(tmp_path: Path, tiny_checkpoint: Path) -> dict[str, str]:
    return {"RUN_DIR": str(tmp_path / "run"), "PORT": str(free_port()), "UI_PORT": str(free_port()),
            "OCR_API_PORT": str(free_port()), "OCR_API_MAX_TOKENS": "16",
            "MODEL": str(tiny_checkpoint), "PYTHON": PYTHON, "STOP_GRACE": "20", "VLLM_API_KEY": "", "UI_AUTH": "",
            "HOST": "127.0.0.1", "UI_HOST": "127.0.0.1"}


def group_members(pgid: int) -> list[str]:
    """Live processes of a group. Zombies are dead: they wait only for their parent (here init,
    which collects them a moment later) to read their exit status, and hold nothing."""
    done = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)], capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if line.strip() and line.split()[1][0] != "Z"]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_start_health_page_stop_cycle(lifecycle_env):
    """Also the security path end to end: API key on vLLM, login on the page."""
    env = {**lifecycle_env, "VLLM_API_KEY": "test-key-123", "UI_AUTH": "alice:wonderland"}
    run_dir = Path(env["RUN_DIR"])
    first = subprocess.Popen([str(ROOT / "start_optimized.sh"), "--max-model-len", str(TEST_MAX_MODEL_LEN),
                              "--cpu-kv-cache-gb", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT, env={**os.environ, **env})
    # A second start of the same RUN_DIR while the first runs: refused at once, saying who holds it.
    wait_for(lambda: (run_dir / ".lock").exists() and (run_dir / ".lock").read_text().startswith("start "), 60,
             "the first start to hold its RUN_DIR")
    second = script("start_optimized.sh", env, timeout=60)
    assert second.returncode == 1, second.stdout + second.stderr
    assert f"{run_dir} is held by a start (PID {first.pid})" in second.stderr and not second.stdout
    stdout, stderr = first.communicate(timeout=400)
    started = subprocess.CompletedProcess(first.args, first.returncode, stdout, stderr)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"Stop:      RUN_DIR={run_dir} ./stop_optimized.sh" in started.stdout  # not the default RUN_DIR
        assert f"Page:      http://127.0.0.1:{env['UI_PORT']}" in started.stdout
        assert f"vLLM API:  http://127.0.0.1:{env['PORT']}/v1" in started.stdout
        assert "random text" in started.stdout  # says plainly this is not real OCR
        # Ready means a page went through the engine, not only that /health answered.
        assert "[start] warm-up: 1 page (one per engine) in " in started.stdout
        assert started.stdout.index("warm-up: 1 page") < started.stdout.index("vLLM is ready")
        assert (f"[start] model family: LightOnOCR-2-1B: max_model_len {TEST_MAX_MODEL_LEN} (asked; the family's is "
                "8192), sampling temperature 0.2 top_p 0.9") in started.stdout
        vllm, ui_service = read_pid_file(run_dir / "vllm.pid"), read_pid_file(run_dir / "ui.pid")
        vllm_pid, ui_pid = vllm.pid, ui_service.pid
        # The PID file holds the start time too: what proves later that the PID is still ours.
        assert vllm.start == proc_info(vllm_pid).start and ui_service.start == proc_info(ui_pid).start
        assert group_members(vllm_pid) and group_members(ui_pid)
        assert '(model "lightonocr-tiny"' in started.stdout

        # The ready-to-paste API example works as printed (served model name, key header).
        example = started.stdout[started.stdout.index("Read a page through the API"):].splitlines()[1:3]
        assert '"temperature": 0.2, "top_p": 0.9' in example[1]  # the served family's sampling (2-1B)
        answer = subprocess.run(["bash", "-c", "\n".join(example)], capture_output=True, text=True, timeout=300,
                                env={**os.environ, "VLLM_API_KEY": "test-key-123"})
        reply = json.loads(answer.stdout)
        assert reply["model"] == "lightonocr-tiny" and reply["choices"][0]["message"]["content"], answer.stdout
        assert requests.get(f"http://127.0.0.1:{env['PORT']}/health", timeout=5).status_code == 200
        page = requests.get(f"http://127.0.0.1:{env['UI_PORT']}/", timeout=10)
        assert page.status_code == 200 and "gradio" in page.text.lower()  # the login page

        api = f"http://127.0.0.1:{env['PORT']}"
        assert requests.get(f"{api}/v1/models", timeout=5).status_code == 401
        assert requests.get(f"{api}/v1/models", headers={"Authorization": "Bearer test-key-123"},
                            timeout=5).status_code == 200
        assert "refused the API key (401)" in OcrClient(api, api_key="wrong").status().error
        with pytest.raises(gr.Error, match="refused the API key"):
            list(OcrPage(OcrClient(api, api_key="wrong", model="x")).extract(
                str(sample_path("table_screenshot.png")), max_tokens=2))
        # The document API beside them: the same key, and a page through it (the README's curl, in Python).
        documents = f"http://127.0.0.1:{env['OCR_API_PORT']}"
        assert f"Documents: {documents}/v1/ocr" in started.stdout
        ocr_api = read_pid_file(run_dir / "ocr-api.pid")
        assert requests.post(f"{documents}/v1/ocr", json={}, timeout=10).status_code == 401
        image = {"type": "image_url", "image_url": prepare_image_bytes(sample_path("table_screenshot.png").read_bytes()).data_url}
        read = requests.post(f"{documents}/v1/ocr", json={"document": image}, timeout=300,
                             headers={"Authorization": "Bearer test-key-123"})
        assert read.status_code == 200 and read.json()["pages"][0]["markdown"], read.text
        ui = f"http://127.0.0.1:{env['UI_PORT']}"
        assert requests.get(f"{ui}/config", timeout=10).status_code == 401
        session = requests.Session()
        assert session.post(f"{ui}/login", data={"username": "alice", "password": "nope"}, timeout=10).status_code == 400
        assert session.post(f"{ui}/login", data={"username": "alice", "password": "wonderland"},
                            timeout=10).status_code == 200
        assert session.get(f"{ui}/config", timeout=10).status_code == 200

        twice = script("start_optimized.sh", env, timeout=60)
        assert twice.returncode == 1 and "already running" in twice.stderr
        assert f"Stop it first: RUN_DIR={run_dir} ./stop_optimized.sh" in twice.stderr
        # --help prints help and touches nothing, on both scripts.
        for name in ("start_optimized.sh", "stop_optimized.sh"):
            helped = script(name, env, "--help", timeout=30)
            assert helped.returncode == 0 and "RUN_DIR" in helped.stdout and not helped.stderr, helped
        assert vllm.alive() and ui_service.alive()

        # Requests in flight while stopping: they fail cleanly, and nothing is left behind.
        page_url = prepare_image_bytes(sample_path("english_a4_document.png").read_bytes()).data_url
        outcomes: list[str] = []

        def long_request():
            try:
                OcrClient(f"http://127.0.0.1:{env['PORT']}", api_key="test-key-123").ocr(
                    page_url, max_tokens=2000, ignore_eos=True)
                outcomes.append("finished")
            except OcrError as exc:
                outcomes.append(exc.kind)

        threads = [threading.Thread(target=long_request) for _ in range(3)]
        for thread in threads:
            thread.start()
    finally:
        stopped = script("stop_optimized.sh", env, timeout=120)
    for thread in threads:
        thread.join(timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert "ui: stopped" in stopped.stdout and "vllm: stopped" in stopped.stdout and "ocr-api: stopped" in stopped.stdout
    assert not vllm.alive() and not ui_service.alive() and not ocr_api.alive()
    assert not group_members(vllm_pid) and not group_members(ui_pid)
    assert not (run_dir / "vllm.pid").exists() and not (run_dir / "ui.pid").exists()
    assert not any(listening(int(env[port])) for port in ("PORT", "UI_PORT", "OCR_API_PORT"))
    assert len(outcomes) == 3 and set(outcomes) <= {"finished", "connection", "bad_response", "http"}

    again = script("stop_optimized.sh", env, timeout=60)
    assert again.returncode == 0 and "vllm: not running" in again.stdout


def test_bad_model_fails_fast_with_the_log_and_leaves_nothing(lifecycle_env, tmp_path):
    env = {**lifecycle_env, "MODEL": str(tmp_path / "no-such-model"), "HOST": "0.0.0.0", "ALLOW_OPEN_API": "1",
           "UI_AUTH": "none", "ALLOW_PLAINTEXT": "1"}
    done = script("start_optimized.sh", env, timeout=120)
    assert done.returncode != 0
    assert "WARNING: the vLLM API on 0.0.0.0 has no API key, on purpose (ALLOW_OPEN_API)" in done.stderr
    assert "WARNING: the vLLM API on 0.0.0.0 serves plain HTTP, on purpose (ALLOW_PLAINTEXT=1)" in done.stderr
    assert "last lines of" in done.stderr and "does not exist" in done.stderr
    assert "nothing left running" in done.stderr
    assert not (Path(env["RUN_DIR"]) / "vllm.pid").exists()
    assert not listening(int(env["PORT"]))


def test_port_already_taken_is_refused_before_anything_starts(lifecycle_env):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", int(lifecycle_env["PORT"])))
        squatter.listen()
        done = script("start_optimized.sh", lifecycle_env, timeout=60)
    assert done.returncode == 1
    assert f"port {lifecycle_env['PORT']} (vLLM) is already in use by another program; set PORT" in done.stderr
    assert not (Path(lifecycle_env["RUN_DIR"]) / "vllm.pid").exists()


def test_stop_never_touches_a_recycled_pid(lifecycle_env):
    """A PID file naming a live process whose command line even looks like vLLM's, but that
    started at another time: the PID was recycled. It is left alone, the file removed."""
    bystander = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(60)", "vllm.entrypoints.openai.api_server",
                                  "start_vllm_server.py"], start_new_session=True)
    try:
        run_dir = Path(lifecycle_env["RUN_DIR"])
        run_dir.mkdir(parents=True)
        wrong_start = proc_info(bystander.pid).start - 1
        (run_dir / "vllm.pid").write_text(f"{bystander.pid} {wrong_start}\n")
        done = script("stop_optimized.sh", lifecycle_env, timeout=60)
        assert done.returncode == 0 and "vllm: not running (removing stale PID file)" in done.stdout
        assert bystander.poll() is None  # still running
        assert not (run_dir / "vllm.pid").exists()
        # A PID file of an older bundle (no start time) proves nothing either: left alone, with the how-to.
        (run_dir / "vllm.pid").write_text(f"{bystander.pid}\n")
        done = script("stop_optimized.sh", lifecycle_env, timeout=60)
        assert done.returncode == 0 and "nothing proves" in done.stdout and f"kill -TERM -- -{bystander.pid}" in done.stdout
        assert bystander.poll() is None
    finally:
        bystander.kill()


def test_stop_finds_the_engine_left_behind_by_a_dead_leader(lifecycle_env):
    """vLLM's API server (the group leader, whose PID was recorded) dies; its engine process
    lives on, holding the GPU and the port. Stop finds the group's surviving members and
    stops them; processes outside the group, and older than the leader, are not touched."""
    run_dir = Path(lifecycle_env["RUN_DIR"])
    run_dir.mkdir(parents=True)
    survivor_pid_file = run_dir / "engine.pid"
    leader = subprocess.Popen(
        ["bash", "-c", f"{PYTHON} -c 'import time; time.sleep(120)' engine-core & echo $! > {survivor_pid_file}; "
                       "sleep 0.5; exit 0"], start_new_session=True)
    recorded = Service.of(leader.pid)
    (run_dir / "vllm.pid").write_text(f"{recorded.pid} {recorded.start}\n")
    outsider = subprocess.Popen(["sleep", "60"])  # another process of this session, not of the group
    try:
        leader.wait(timeout=10)
        engine = int(survivor_pid_file.read_text())
        assert proc_info(engine).pgid == recorded.pid and not recorded.leader_alive()
        done = script("stop_optimized.sh", lifecycle_env, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"its leader {recorded.pid} is gone but 1 process(es) of its group are not ({engine})" in done.stdout
        assert "vllm: stopped" in done.stdout
        assert proc_info(engine) is None or proc_info(engine).state == "Z"
        assert outsider.poll() is None
        assert not (run_dir / "vllm.pid").exists()
    finally:
        outsider.kill()
        try:
            os.kill(int(survivor_pid_file.read_text()), 9)
        except (ProcessLookupError, ValueError, FileNotFoundError):
            pass


@pytest.mark.slow
def test_restart_by_the_scripts_while_the_page_is_in_use(lifecycle_env):
    """stop + start again in the same RUN_DIR; a page session opened afterwards (a reload) works.

    A browser tab left open across the restart could not upload into the new page process
    (Gradio's front end; nondeterministic, so not asserted here): the page's "no file"
    message tells that person to reload."""
    from gradio_client import Client, handle_file

    env = lifecycle_env
    extra = ("--max-model-len", str(TEST_MAX_MODEL_LEN), "--cpu-kv-cache-gb", "1")
    ui = f"http://127.0.0.1:{env['UI_PORT']}"
    sample = handle_file(str(sample_path("table_screenshot.png")))
    arguments = (sample, 1, False, 16, 0.2, "PNG", False, [])  # the page's inputs: ... encoding, grounding, drop
    try:
        assert script("start_optimized.sh", env, *extra).returncode == 0
        before = Client(ui, verbose=False)
        assert "16 output tokens" in before.predict(*arguments, api_name="/extract")[2]
        assert script("stop_optimized.sh", env, timeout=120).returncode == 0
        restarted = script("start_optimized.sh", env, *extra)
        assert restarted.returncode == 0, restarted.stderr
        after = Client(ui, verbose=False)  # what a reload does: a new session
        assert "16 output tokens" in after.predict(*arguments, api_name="/extract")[2]
    finally:
        script("stop_optimized.sh", env, timeout=120)


@pytest.mark.slow
def test_a_stop_during_a_start_cancels_the_start_and_stops_what_it_started(lifecycle_env):
    """Two at once, the other way: the stop asks the start to give up (TERM), the start stops what it had
    started and exits 143, then the stop holds the RUN_DIR and finds nothing left. UI=0 means no page."""
    env = {**lifecycle_env, "UI": "0"}
    run_dir = Path(env["RUN_DIR"])
    start = subprocess.Popen([str(ROOT / "start_optimized.sh"), "--max-model-len", str(TEST_MAX_MODEL_LEN),
                              "--cpu-kv-cache-gb", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT, env={**os.environ, **env})
    vllm = wait_for(lambda: read_pid_file(run_dir / "vllm.pid"), 120, "the start to launch vLLM")
    stopped = script("stop_optimized.sh", env, timeout=180)
    stdout, stderr = start.communicate(timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"a start (PID {start.pid}) holds {run_dir}: cancelling it" in stopped.stdout
    assert start.returncode == 143, stdout + stderr
    assert "cancelled" in stderr and "nothing left running" in stderr
    assert "starting the page" not in stdout and not (run_dir / "ui.log").exists()  # UI=0 is off
    assert not vllm.alive() and not group_members(vllm.pid) and not list(run_dir.glob("*.pid"))
    assert not listening(int(env["PORT"]))


def test_settings_that_cannot_work_are_refused_before_anything_starts(lifecycle_env):
    """UI must say on or off; the gateway's metrics port is checked with the others."""
    done = script("start_optimized.sh", {**lifecycle_env, "UI": "maybe"}, timeout=60)
    assert done.returncode == 2 and "UI must be on or off" in done.stderr
    done = script("start_optimized.sh", {**lifecycle_env, "OCR_API": "perhaps"}, timeout=60)
    assert done.returncode == 2 and "OCR_API must be on or off" in done.stderr
    # The head's own server listens on PORT+1: the document API may not be given that port too.
    server_port = int(lifecycle_env["PORT"]) + 1
    clash = {**lifecycle_env, "ROUTER": "on", "ROUTER_ADMIN_KEY": "admin-key", "ROUTER_METRICS_PORT": str(free_port()),
             "OCR_API_PORT": str(server_port)}
    done = script("start_optimized.sh", clash, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"port {server_port} is set for both vLLM (SERVER_PORT) and document API (OCR_API_PORT)" in done.stderr
    assert not list(Path(clash["RUN_DIR"]).glob("*.pid"))
    metrics_port = free_port()
    head = {**lifecycle_env, "ROUTER": "on", "ROUTER_ADMIN_KEY": "admin-key", "ROUTER_METRICS_PORT": str(metrics_port)}
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", metrics_port))
        squatter.listen()
        done = script("start_optimized.sh", head, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"port {metrics_port} (gateway metrics) is already in use by another program; set ROUTER_METRICS_PORT" \
        in done.stderr
    assert not list(Path(head["RUN_DIR"]).glob("*.pid"))


def test_a_vllm_that_cannot_build_its_parser_here_leaves_the_rule_without_it(tmp_path):
    """vLLM 0.34's CUDA build on a machine without a GPU raises "Failed to infer device type" while it builds
    `vllm serve`'s parser (seen with its wheel set rehearsed on this CPU, benchmarks/rehearse_wheels.sh; with a
    device its parser builds and refuses the same spellings). A stand-in vLLM that raises the same way: the
    launcher takes no parser, and a key after -- is still refused by the rule that needs none."""
    fake = tmp_path / "fake"
    (fake / "vllm" / "utils").mkdir(parents=True)
    (fake / "vllm" / "entrypoints" / "common").mkdir(parents=True)
    for package in ("vllm", "vllm/utils", "vllm/entrypoints", "vllm/entrypoints/common"):
        (fake / package / "__init__.py").write_text("")
    (fake / "vllm" / "utils" / "argparse_utils.py").write_text(
        "from argparse import ArgumentParser as FlexibleArgumentParser\n")
    (fake / "vllm" / "entrypoints" / "common" / "cli_args.py").write_text(
        "def make_arg_parser(parser):\n    raise RuntimeError('Failed to infer device type')\n")
    probe = ("from ocr_bundle.serve.launch import KEY_ON_ARGV, passthrough_problem, vllm_argument_parser\n"
             "parser = vllm_argument_parser()\n"
             "print(parser is None, passthrough_problem(['--api-k', 'S'], parser) == KEY_ON_ARGV)\n")
    done = subprocess.run([PYTHON, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": f"{fake}{os.pathsep}{ROOT}"}, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


@pytest.mark.slow
@pytest.mark.needs_vllm
def test_a_key_or_tls_after_double_dash_is_refused_however_spelled(lifecycle_env, tmp_path):
    """vLLM's own parser reads what follows --: every spelling it accepts for --api-key and --ssl-* is
    refused (exit 2) before anything starts, a flag it refuses is said with its values masked."""
    from ocr_bundle.serve.launch import KEY_ON_ARGV, TLS_ON_ARGV, passthrough_problem, vllm_argument_parser

    parser = vllm_argument_parser()
    assert parser is not None
    config = tmp_path / "vllm.yaml"
    config.write_text("api-key: SECRET-IN-A-FILE\n")
    for spelling in (["--api-key", "S"], ["--api_key", "S"], ["--api-k", "S"], ["--api_ke=S"], ["--api-key=S"],
                     ["--config", str(config)]):
        assert passthrough_problem(spelling, parser) == KEY_ON_ARGV, spelling
    for spelling in (["--ssl-keyfile", "k.pem"], ["--ssl_certfile", "c.pem"], ["--ssl-ca", "ca.pem"]):
        assert passthrough_problem(spelling, parser) == TLS_ON_ARGV, spelling
    assert passthrough_problem(["--enforce-eager", "--max-num-seqs", "8"], parser) is None
    typo = passthrough_problem(["--max-num-seqs", "SECRET-VALUE"], parser)
    assert "invalid int value" in typo and "SECRET-VALUE" not in typo
    # Without vLLM's parser (a dry run where vLLM is not installed), the same spellings by argparse's rule.
    for spelling in (["--api_key", "S"], ["--api-k", "S"], ["--api_ke=S"]):
        assert passthrough_problem(spelling) == KEY_ON_ARGV, spelling
    done = script("start_optimized.sh", {**lifecycle_env, "UI": "off"}, "--", "--api_key", "SECRET-ON-ARGV",
                  timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "an API key after -- would put it on vLLM's command line" in done.stderr
    assert "SECRET-ON-ARGV" not in done.stdout + done.stderr
    assert not list(Path(lifecycle_env["RUN_DIR"]).glob("*.pid")) and not listening(int(lifecycle_env["PORT"]))
