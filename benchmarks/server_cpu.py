#!/usr/bin/env python3
"""CPU time of a vLLM server's processes, by role, over a stretch of load.

    python3 benchmarks/server_cpu.py snapshot /root/bench/server.pid before.json
    ... load ...
    python3 benchmarks/server_cpu.py snapshot /root/bench/server.pid after.json
    python3 benchmarks/server_cpu.py diff before.json after.json --pages 768
    python3 benchmarks/server_cpu.py pids /root/bench/server.pid --role VLLM::EngineCore
    python3 benchmarks/server_cpu.py around /root/bench/server.pid REPORT_DIR -- python3 stress_test.py --out REPORT_DIR ...

`around` is the three steps in one: snapshot, the command (a stress run writing REPORT_DIR/results.json),
snapshot, then the difference over the pages it read into REPORT_DIR/server-cpu.json; it exits with
the command's status.

vLLM names its processes (setproctitle): the API servers, the engine cores (one per data
parallel replica), the DP coordinator. Their CPU seconds per page say which one would
saturate first as the page rate grows: an API server is one Python process, so one core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ocr_bundle.serve.processes import all_processes, read_pid_file  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def role_of(pid: int) -> str:
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return "?"
    return title.split()[0] if title.startswith("VLLM") else Path(title).name or "?"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def snapshot(pid_file: Path) -> dict[str, dict]:
    service = read_pid_file(pid_file)
    out = {}
    for info in all_processes():
        if service and info.pgid == service.pid:
            try:
                out[str(info.pid)] = {"role": role_of(info.pid), "cpu_s": cpu_seconds(info.pid)}
            except OSError:
                continue
    return out


def diff(before: dict, after: dict, pages: int) -> dict[str, dict]:
    by_role: dict[str, dict] = defaultdict(lambda: {"processes": 0, "cpu_s": 0.0})
    for pid, now in after.items():
        spent = now["cpu_s"] - before.get(pid, {}).get("cpu_s", 0.0)
        by_role[now["role"]]["processes"] += 1
        by_role[now["role"]]["cpu_s"] += spent
    for role in by_role.values():
        role["cpu_ms_per_page"] = round(1000 * role["cpu_s"] / pages, 2) if pages else None
        role["cpu_s"] = round(role["cpu_s"], 2)
    return dict(sorted(by_role.items()))


def pages_read(report_dir: Path) -> int:
    """The pages a stress run read (every level's ok), from its results.json; 0 if it wrote none."""
    try:
        return sum(level["ok"] for level in json.loads((report_dir / "results.json").read_text())["levels"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def around(pid_file: Path, report_dir: Path, command: list[str]) -> int:
    before = snapshot(pid_file)
    status = subprocess.run(command, check=False).returncode
    result = diff(before, snapshot(pid_file), pages_read(report_dir))
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "server-cpu.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    snap = commands.add_parser("snapshot", help="CPU seconds of every process of the server's group")
    snap.add_argument("pid_file", type=Path)
    snap.add_argument("out", type=Path)
    change = commands.add_parser("diff", help="CPU spent between two snapshots, by role, per page")
    change.add_argument("before", type=Path)
    change.add_argument("after", type=Path)
    change.add_argument("--pages", type=int, required=True)
    pids = commands.add_parser("pids", help="the PIDs of the server's processes of one role, one per line")
    pids.add_argument("pid_file", type=Path)
    pids.add_argument("--role", required=True, help="the role or its start, e.g. VLLM::EngineCore, VLLM::Worker")
    wrap = commands.add_parser("around", help="CPU by role over one command (a stress run), per page it read")
    wrap.add_argument("pid_file", type=Path)
    wrap.add_argument("report_dir", type=Path, help="where the command writes results.json; server-cpu.json goes there")
    wrap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args()
    if args.command == "around":
        command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not command:
            parser.error("around needs a command after --")
        sys.exit(around(args.pid_file, args.report_dir, command))
    if args.command == "pids":
        service = read_pid_file(args.pid_file)
        members = service.members() if service else []
        found = [info.pid for info in members if role_of(info.pid).startswith(args.role)]
        print("\n".join(map(str, found)))
        sys.exit(0 if found else 1)
    if args.command == "snapshot":
        args.out.write_text(json.dumps(snapshot(args.pid_file)))
    else:
        result = diff(json.loads(args.before.read_text()), json.loads(args.after.read_text()), args.pages)
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
