"""The GPU driver's helpers that run on any machine: py-spy stack summaries (benchmarks/stack_top.py)
and a server's processes by role (benchmarks/server_cpu.py pids, and its CPU over a command: around),
against the session's real vLLM server."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import PYTHON, ROOT, Started

from ocr_bundle.serve.processes import write_pid_file

# py-spy's raw output (`record --format raw --threads`): one distinct stack per line, then its count.
RAW = """\
thread (101): MainThread;run_busy_loop (/s/vllm/v1/engine/core.py:900);step (/s/vllm/v1/engine/core.py:410);execute_model (/s/vllm/v1/worker/gpu/model_runner.py:120) 60
thread (101): MainThread;run_busy_loop (/s/vllm/v1/engine/core.py:900);step (/s/vllm/v1/engine/core.py:412);sample (/s/vllm/v1/sample/sampler.py:55) 30
thread (101): MainThread;run_busy_loop (/s/vllm/v1/engine/core.py:905) 10
thread (102): Thread-3 (process_output_sockets);wait (/usr/lib/python3.12/threading.py:355) 100
"""


def stack_top(raw: Path, *args: str) -> str:
    return subprocess.run([PYTHON, str(ROOT / "benchmarks" / "stack_top.py"), str(raw), *args],
                          capture_output=True, text=True, check=True, timeout=60).stdout


def test_stack_top_adds_up_a_function_over_its_lines_per_thread(tmp_path: Path) -> None:
    raw = tmp_path / "engine.txt"
    raw.write_text(RAW)
    report = stack_top(raw, "--min-share", "0")
    main, other = report.split("thread Thread-3 (process_output_sockets)")
    assert main.startswith("thread MainThread\n  100 samples")
    # `step` appears at two lines (410, 412): inside it are 60 + 30 of the thread's 100 samples.
    assert " 90.0%  step (engine/core.py)" in main
    assert " 60.0%  execute_model (gpu/model_runner.py)" in main
    # Own samples: the busy loop ran itself in 10 of them; a caller's frame is not its own time.
    own = main.split("inclusive samples")[0]
    assert " 10.0%  run_busy_loop (engine/core.py)" in own
    assert "step (engine/core.py)" not in own
    assert "100.0%  wait (python3.12/threading.py)" in other and "MainThread" not in other


def test_stack_top_refuses_a_file_without_stacks(tmp_path: Path) -> None:
    raw = tmp_path / "empty.txt"
    raw.write_text("py-spy> nothing sampled\n")
    result = subprocess.run([PYTHON, str(ROOT / "benchmarks" / "stack_top.py"), str(raw)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1 and "no stacks" in result.stderr


def test_server_cpu_finds_the_engine_core_of_a_real_server(vllm_server: Started, tmp_path: Path) -> None:
    pid_file = tmp_path / "server.pid"
    write_pid_file(pid_file, vllm_server.service.pid)

    def pids(role: str) -> subprocess.CompletedProcess:
        return subprocess.run([PYTHON, str(ROOT / "benchmarks" / "server_cpu.py"), "pids", str(pid_file),
                               "--role", role], capture_output=True, text=True, timeout=60, check=False)

    found = pids("VLLM::EngineCore")
    assert found.returncode == 0, found.stderr
    engines = [int(line) for line in found.stdout.split()]
    assert len(engines) == 1
    title = Path(f"/proc/{engines[0]}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert title.startswith("VLLM::EngineCore")
    assert engines[0] != vllm_server.service.pid  # the engine core is a child, not the API server
    missing = pids("VLLM::NoSuchRole")
    assert missing.returncode == 1 and missing.stdout.strip() == ""


def test_server_cpu_around_a_command_charges_its_pages_by_role(vllm_server: Started, tmp_path: Path) -> None:
    """`around` runs the command (here: one real chat request, then a results.json of 2 pages read, and
    exit status 3), then writes the CPU each role spent meanwhile, per page, next to the results."""
    pid_file = tmp_path / "server.pid"
    write_pid_file(pid_file, vllm_server.service.pid)
    report = tmp_path / "report"
    client = (
        "import json, sys, urllib.request\n"
        f"url = {vllm_server.url!r}\n"
        "model = json.load(urllib.request.urlopen(url + '/v1/models'))['data'][0]['id']\n"
        "body = json.dumps({'model': model, 'max_tokens': 8, 'messages': [{'role': 'user', 'content': 'hi'}]})\n"
        "request = urllib.request.Request(url + '/v1/chat/completions', body.encode(), "
        "{'Content-Type': 'application/json'})\n"
        "urllib.request.urlopen(request, timeout=120).read()\n"
        f"open({str(report / 'results.json')!r}, 'w').write(json.dumps({{'levels': [{{'ok': 1}}, {{'ok': 1}}]}}))\n"
        "sys.exit(3)\n")
    report.mkdir()
    result = subprocess.run([PYTHON, str(ROOT / "benchmarks" / "server_cpu.py"), "around", str(pid_file), str(report),
                             "--", PYTHON, "-c", client], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 3, result.stderr
    roles = json.loads((report / "server-cpu.json").read_text())
    engine = next(value for role, value in roles.items() if role.startswith("VLLM::EngineCore"))
    assert engine["processes"] == 1 and engine["cpu_s"] > 0
    assert abs(engine["cpu_ms_per_page"] - 1000 * engine["cpu_s"] / 2) <= 2.5  # cpu_s is rounded to 10 ms
    assert json.loads(result.stdout) == roles


def test_rounds_run_in_order_with_their_variables_and_wait_for_a_version_still_being_staged(tmp_path: Path) -> None:
    """benchmarks/rounds.sh with stand-ins for the two GPU scripts it drives: each line becomes one
    version_bench.sh call (its VAR=value words in the environment, the rest as arguments), and a round
    of a version not installed yet waits for setup to install it (here: on its second call)."""
    bundle = tmp_path / "bundle"
    (bundle / "benchmarks").mkdir(parents=True)
    (bundle / "benchmarks" / "rounds.sh").write_text((ROOT / "benchmarks" / "rounds.sh").read_text())
    sites = tmp_path / "sites"
    # setup installs 0.26.0 at once and 0.32.0 only on its second call, as when parts are still arriving.
    (bundle / "benchmarks" / "gpu_bench.sh").write_text(
        f'mkdir -p {sites}/site/vllm; n=$(cat {tmp_path}/calls 2>/dev/null || echo 0)\n'
        f'echo $((n + 1)) >{tmp_path}/calls\n'
        f'(( n >= 1 )) && mkdir -p {sites}/site-0.32.0/vllm; true\n')
    (bundle / "benchmarks" / "version_bench.sh").write_text(
        'echo "concurrency 1: $*"; echo "FLASHINFER=${FLASHINFER:-unset} LONE=${LONE:-unset}"\n'
        '[[ $2 != broken ]] || { echo "quality_check.py exit status 1 (worse)"; exit 1; }\n')
    rounds = tmp_path / "rounds.txt"
    rounds.write_text("# a comment line\n"
                      "FLASHINFER=1 0.26.0 fp8 first --compile-encoder on  # and a comment after a round\n"
                      "\n"
                      "0.26.0 bf16 broken\n"
                      'LONE=0 0.32.0 bf16 second -- --compilation-config {"compile_mm_encoder":true}\n')
    env = {"PATH": "/usr/bin:/bin", "STATE": str(tmp_path / "state"), "SITES": str(sites),
           "OUT": str(tmp_path / "out")}
    (tmp_path / "out").mkdir()
    script = bundle / "benchmarks" / "rounds.sh"
    started = subprocess.run(["bash", str(script), "start", str(rounds)], env=env, capture_output=True, text=True,
                             timeout=60, check=True)
    assert "3 round(s)" in started.stdout
    waited = subprocess.run(["bash", str(script), "wait", "50"], env=env, capture_output=True, text=True,
                            timeout=60, check=True)
    assert "all rounds ended" in waited.stdout
    results = tmp_path / "state" / "rounds" / "out"
    first = (results / "first-round.txt").read_text()
    assert f"concurrency 1: fp8 first {sites}/site --compile-encoder on\nFLASHINFER=1 LONE=unset" in first
    second = (results / "second-round.txt").read_text()
    assert (f'concurrency 1: bf16 second {sites}/site-0.32.0 -- --compilation-config {{"compile_mm_encoder":true}}'
            "\nFLASHINFER=unset LONE=0") in second
    progress = (tmp_path / "state" / "rounds" / "progress").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in progress] == [
        "first: started", "first: done: concurrency 1: fp8 first " + f"{sites}/site --compile-encoder on ",
        "broken: started", "broken: FAILED (see broken-round.txt) quality_check.py exit status 1 (worse)",
        "second: started", "second: done: concurrency 1: bf16 second " + f"{sites}/site-0.32.0 -- --compilation-config "
        '{"compile_mm_encoder":true} ']
    assert (tmp_path / "out" / "rounds.tgz").stat().st_size > 0


def test_the_door_knock_names_a_route_that_answers_without_the_key(tmp_path: Path) -> None:
    """benchmarks/doors.py (DOORS=1 in version_bench.sh: how a vLLM version joins route_keys.VERIFIED on the GPU)
    against a stand-in server that lists 24 routes at start as vLLM does and keys all but /invocations: the verdict
    names that door and fails; keyed everywhere, it passes. The key travels in the environment only."""
    import http.server
    import threading

    open_door = {"path": "/invocations"}

    class Server(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            keyed = self.headers.get("Authorization") == "Bearer door-key"
            status = 200 if keyed or self.path in ("/health", "/metrics", open_door["path"]) else 401
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = answer

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    paths = ["/health", "/metrics", "/invocations", "/v1/chat/completions", "/tokenize"] + [f"/v1/r{i}/{{item}}"
                                                                                           for i in range(19)]
    log = tmp_path / "vllm.log"
    log.write_text("".join(f"(APIServer pid=1) INFO [launcher.py:46] Route: {path}, Methods: "
                           f"{'GET' if path in ('/health', '/metrics') else 'POST'}\n" for path in paths))
    knock = [PYTHON, str(ROOT / "benchmarks" / "doors.py"), "stand-in", f"http://127.0.0.1:{server.server_port}",
             "--log", str(log), "--verdict"]
    env = {"PATH": "/usr/bin:/bin", "VLLM_API_KEY": "door-key"}
    try:
        leaky = subprocess.run(knock, env=env, capture_output=True, text=True, timeout=60)
        open_door["path"] = None
        locked = subprocess.run(knock, env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert leaky.returncode == 1, leaky.stdout + leaky.stderr
    assert "stand-in POST /invocations 200 200 200" in leaky.stdout
    assert leaky.stdout.splitlines()[-1] == "doors: stand-in: 24 routes, 1 break the key rule: POST /invocations"
    assert "stand-in POST /v1/r3/x 401 401 200" in locked.stdout  # a path parameter knocked on as x
    assert locked.returncode == 0 and locked.stdout.splitlines()[-1].startswith(
        "doors: stand-in: 24 routes, 0 break the key rule"), locked.stdout + locked.stderr
    assert "door-key" not in leaky.stdout + locked.stdout


@pytest.mark.slow  # SMG and a few hundred pages: ~20 s on 2 cores
def test_the_corpus_benchmark_finds_every_page_once_through_kills_links_and_another_mount(tmp_path: Path) -> None:
    """benchmarks/corpus_bench.py at a small size: its own check (every page's text once in its .md, the
    output holding no other document) and --status from the other mount must both pass."""
    import json

    done = subprocess.run([PYTHON, str(ROOT / "benchmarks" / "corpus_bench.py"), "--work", str(tmp_path / "bench"),
                           "--docs", "120", "--pages", "3", "--servers", "4", "--server-groups", "2",
                           "--converters", "4", "--kill-after", "2"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "bench" / "report.json").read_text())
    assert report["check"]["every_page_once"] and report["check"]["documents"] == 161
    assert report["status_from_mount_b"]["verdict"].startswith("complete: every page of the 161 document(s)")
    assert [phase["exits"] for phase in report["phases"]][1:] == [[0, 0], [0, 0, 0, 0]]


def test_site_pythonpath_imports_what_a_target_install_pth_would_add(tmp_path: Path) -> None:
    """`pip install --target SITE` leaves nvidia-cutlass-dsl's .pth in SITE, which Python does not run from a
    PYTHONPATH folder: gpu_platform.sh's site_pythonpath names its folder, so `import cutlass` works there."""
    site = tmp_path / "site"
    package = site / "nvidia_cutlass_dsl" / "dsl_packages" / "cutlass"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("WHERE = __file__\n")
    (site / "nvidia_cutlass_dsl_packages.pth").write_text("import sys; sys.path.insert(0, 'never-run')\n")
    script = ('source benchmarks/gpu_platform.sh; '
              f'PYTHONPATH=$(site_pythonpath {site}) "$0" -c "import cutlass; print(cutlass.WHERE)"')
    plain = subprocess.run([PYTHON, "-c", "import cutlass"], env={"PYTHONPATH": str(site)}, cwd=ROOT,
                           capture_output=True, text=True, timeout=60, check=False)
    assert plain.returncode == 1 and "No module named 'cutlass'" in plain.stderr
    found = subprocess.run(["bash", "-c", script, PYTHON], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           check=True)
    assert found.stdout.strip() == str(package / "__init__.py")


def test_serve_env_gives_a_set_with_flashinfer_its_ninja_and_nvcc_and_a_set_without_nothing(tmp_path: Path) -> None:
    """gpu_platform.sh's serve_env, the one rule gpu_bench.sh and version_bench.sh serve by: a set that carries
    FlashInfer (0.34.0's) gets its ninja on PATH, after the image's own, and CUDA_HOME, without which vLLM 0.34
    turns FlashInfer off; FLASHINFER=1 adds 0.26.0's FlashInfer folder first; a set without it changes no PATH."""
    with_fi, without_fi = tmp_path / "site-fi", tmp_path / "site-plain"
    for site in (with_fi, without_fi):
        (site / "bin").mkdir(parents=True)
        ninja = site / "bin" / "ninja"
        ninja.write_text(f"#!/bin/sh\necho {site.name}\n")
        ninja.chmod(0o755)
    (with_fi / "flashinfer").mkdir()
    show = ('source benchmarks/gpu_platform.sh; serve_env "$1"; '
            'echo "$PYTHONPATH"; echo "$PATH"; echo "${CUDA_HOME:-unset}"; ninja 2>/dev/null || echo "no ninja"')

    def serve_env(site: Path, **extra: str) -> list[str]:
        env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": "/opt/cuda-test", **extra}
        return subprocess.run(["bash", "-c", show, "bash", str(site)], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=60, check=True).stdout.splitlines()

    pythonpath, path, cuda_home, *_ = serve_env(with_fi)
    assert pythonpath == f"{with_fi}:{with_fi}/nvidia_cutlass_dsl/dsl_packages"
    assert path == f"/usr/bin:/bin:{with_fi}/bin"   # the set's scripts never shadow the image's
    assert cuda_home == "/opt/cuda-test"             # one already set is kept
    pythonpath, path, cuda_home, *_ = serve_env(without_fi)
    assert path == "/usr/bin:/bin" and pythonpath == f"{without_fi}:{without_fi}/nvidia_cutlass_dsl/dsl_packages"
    pythonpath, path, *_ = serve_env(without_fi, FLASHINFER="1")
    assert pythonpath.endswith(":/root/site-flashinfer") and path.startswith("/root/site-flashinfer/bin:")
    assert path.endswith(f":{without_fi}/bin")
    # The set's ninja is what FlashInfer's builds find where the image has none on the PATH.
    bash = shutil.which("bash") or "/bin/bash"
    bare = subprocess.run([bash, "-c", show, "bash", str(with_fi)], env={"PATH": "/nonexistent"}, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert bare.stdout.splitlines()[-1] == "site-fi"


def test_waves_splits_a_saturation_run_into_its_first_wave_and_its_drain(tmp_path: Path) -> None:
    """benchmarks/waves.py on a run of 6 pages at concurrency 4: four start together and end at 10 s, two start then
    and end at 15 s. Whole run 0.4 pages/s, first wave 4 / 10 s, drain the last third with 2 in flight, no sustained
    stretch; a level without a full first wave has no row, and a file that is no results.json is refused (exit 2).
    A ramped level at concurrency 2 (sends at 0 and 1 s, then one as each 2-s page is answered) adds its sustained
    rate by the stress test's rule: from 4 s (the first answer to a page sent with both slots busy) to 7 s (the
    last send), two pages and a failure answered."""
    first = [{"concurrency": 4, "ok": True, "start_s": 0.0, "end_s": 10.0}] * 4
    drain = [{"concurrency": 4, "ok": True, "start_s": 10.0, "end_s": 15.0}] * 2
    lone = [{"concurrency": 8, "ok": True, "start_s": 20.0, "end_s": 21.0}]
    ramped = [{"concurrency": 2, "ok": start != 5.0, "start_s": start, "end_s": start + 2.0} for start in range(8)]
    results = {"levels": [{"concurrency": 4, "pages_per_s": 6 / 15}, {"concurrency": 8, "pages_per_s": 1.0},
                          {"concurrency": 2, "pages_per_s": 7 / 9}],
               "requests": first + drain + lone + ramped}
    path = tmp_path / "run-c4" / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(results))
    shown = subprocess.run([PYTHON, "benchmarks/waves.py", str(path)], cwd=ROOT, capture_output=True, text=True,
                           timeout=60, check=True).stdout.splitlines()
    assert shown == ["run-c4: c=4 6 pages, 0.40 pages/s; first wave 0.40 pages/s; drain 33% of the run, "
                     "2 in flight 5 s before the end",
                     "run-c4: c=2 7 pages, 0.78 pages/s; first wave 0.67 pages/s; drain 22% of the run, "
                     "2 in flight 5 s before the end; sustained 0.67 pages/s over 2 pages"]
    refused = subprocess.run([PYTHON, "benchmarks/waves.py", str(ROOT / "README.md")], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2 and "not a stress test's results.json" in refused.stderr
