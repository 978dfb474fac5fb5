"""Record, find, wait for and stop the bundle's background services: the one implementation.

start_optimized.sh and stop_optimized.sh call it as `python3 -m ocr_bundle.serve.processes ...`,
the tests and the GPU benchmark driver import it. Standard library only, so any python3
runs it, before the one with vLLM is known.

    python3 -m ocr_bundle.serve.processes record run/vllm.pid 12345
    python3 -m ocr_bundle.serve.processes running run/vllm.pid          # exit 0 and the PID if ours and alive
    python3 -m ocr_bundle.serve.processes wait-ready http://127.0.0.1:8000/health --pid-file run/vllm.pid --timeout 900
    python3 -m ocr_bundle.serve.processes stop run/vllm.pid --name vllm --grace 30
    python3 -m ocr_bundle.serve.processes hold-record run/.lock start 4321   # who holds RUN_DIR (lifecycle.sh)
    python3 -m ocr_bundle.serve.processes signal-holder run/.lock TERM       # a stop cancelling a start

wait-ready speaks HTTPS when the URL says so, with this machine's TLS from the environment
(TLS_CA to verify, TLS_CERT/TLS_KEY presented: a server behind a gateway requires a client
certificate); a certificate that does not verify ends the wait at once, explained.

Services are started with setsid, so each leads its own process group and its PID is the
group id: stopping the group also stops the engine processes vLLM forks. A PID file holds
"PID START": the process start time from /proc/PID/stat, so a recycled PID (even one now
running another vLLM) is never taken for ours. A group outlives its leader when vLLM's
API server dies before its engine; stop still finds and stops the members, which Linux
keeps in the recorded group id (a group id is not reused while the group has members),
and which started no earlier than the recorded leader.
"""

from __future__ import annotations

import argparse
import os
import signal
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ocr_bundle import tls
from ocr_bundle.settings import number_at_least_zero, positive_int, positive_number

POLL_S = 0.2
KILL_WAIT_S = 5.0


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    state: str  # "R", "S", "Z" (zombie: exited, not yet reaped), ...
    pgid: int
    start: int  # clock ticks after boot: with the PID, a process's identity


def proc_info(pid: int) -> ProcInfo | None:
    """What /proc says about a process, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    return ProcInfo(pid, fields[0], int(fields[2]), int(fields[19]))


def all_processes() -> Iterable[ProcInfo]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = proc_info(int(entry))
            if info is not None:
                yield info


@dataclass(frozen=True)
class Service:
    """A recorded service: the leader's PID and its start time.

    PID files of older bundles hold no start time (start None): nothing then proves the
    PID is still ours, so such a service is never signalled."""

    pid: int
    start: int | None

    @classmethod
    def of(cls, pid: int) -> Service:
        info = proc_info(pid)
        if info is None:
            raise ProcessLookupError(f"no process {pid}")
        return cls(pid, info.start)

    def leader_alive(self) -> bool:
        info = proc_info(self.pid)
        return info is not None and info.state != "Z" and info.start == self.start

    def members(self) -> list[ProcInfo]:
        """Live processes of the service's group (zombies hold nothing and are skipped)."""
        if self.start is None:
            return []
        holder = proc_info(self.pid)
        if holder is not None and holder.start != self.start:
            # The PID belongs to a newer process: Linux reuses a PID only once no group uses it
            # as its id, so our group is gone, and any group with this id now is someone else's.
            return []
        return [info for info in all_processes()
                if info.pgid == self.pid and info.state != "Z" and info.start >= self.start]

    def alive(self) -> bool:
        return self.leader_alive() or bool(self.members())


class LiveServiceRecorded(Exception):
    """A PID file names a live service: it is never overwritten (two starts must not both record)."""


def write_pid_file(path: Path, pid: int) -> Service:
    service = Service.of(pid)
    recorded = read_pid_file(path)
    if recorded is not None and recorded.pid != pid and recorded.alive():
        raise LiveServiceRecorded(f"{path} names a live service (PID {recorded.pid}): not overwritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(f"{service.pid} {service.start}\n")
    os.replace(temporary, path)
    return service


def read_pid_file(path: Path) -> Service | None:
    try:
        fields = path.read_text().split()
    except FileNotFoundError:
        return None
    if not fields or not fields[0].isdigit():
        return None
    start = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return Service(int(fields[0]), start)


def record_holder(lock_file: Path, what: str, pid: int) -> None:
    """Name the holder of a RUN_DIR lock in the lock file itself ("start PID START"), written in place: a
    new file (os.replace) would be another inode, and the lock (flock) is held on this one."""
    service = Service.of(pid)
    with open(lock_file, "r+") as handle:
        handle.truncate(0)
        handle.write(f"{what} {service.pid} {service.start}\n")


def signal_holder(lock_file: Path, signum: int) -> int | None:
    """Signal the process a RUN_DIR lock file names, if it is still that process; its PID or None."""
    try:
        fields = lock_file.read_text().split()
    except FileNotFoundError:
        return None
    if len(fields) < 3 or not fields[1].isdigit() or not fields[2].isdigit():
        return None
    holder = Service(int(fields[1]), int(fields[2]))
    if not holder.leader_alive():
        return None
    os.kill(holder.pid, signum)
    return holder.pid


def _signal_members(service: Service, signum: int) -> None:
    for info in service.members():
        try:
            os.kill(info.pid, signum)
        except ProcessLookupError:
            pass


def _wait_gone(service: Service, seconds: float, reap: Callable[[], None] | None) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        if reap:
            reap()
        if not service.alive():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def stop(service: Service, name: str, grace_s: float, say: Callable[[str], None] = print,
         reap: Callable[[], None] | None = None) -> bool:
    """TERM the leader (vLLM then stops its engine cleanly, ~2 s), then TERM the rest of the
    group, then KILL it; only processes that are still ours. True once nothing is left.

    `reap` lets a parent that started the leader (the tests) collect it as it exits.
    """
    if service.leader_alive():
        say(f"{name}: stopping process group {service.pid} (TERM)")
        try:
            os.kill(service.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        if _wait_gone(service, grace_s, reap):
            return True
        say(f"{name}: still running after {grace_s:g}s, sending TERM to the whole group")
    else:
        leftovers = service.members()
        if not leftovers:
            return True
        say(f"{name}: its leader {service.pid} is gone but {len(leftovers)} process(es) of its group are "
            f"not ({', '.join(str(i.pid) for i in leftovers)}): stopping them (TERM)")
    _signal_members(service, signal.SIGTERM)
    if _wait_gone(service, KILL_WAIT_S, reap):
        return True
    say(f"{name}: sending KILL to the group")
    _signal_members(service, signal.SIGKILL)
    if service.leader_alive():
        os.kill(service.pid, signal.SIGKILL)
    if _wait_gone(service, KILL_WAIT_S, reap):
        return True
    say(f"{name}: WARNING: processes of group {service.pid} survived KILL")
    return False


def stop_recorded(pid_file: Path, name: str, grace_s: float, say: Callable[[str], None] = print) -> bool:
    """Stop the service a PID file records, and remove the file. Harmless when stopped."""
    service = read_pid_file(pid_file)
    if service is None:
        say(f"{name}: not running")
        return True
    if service.start is None:
        say(f"{name}: {pid_file} was written by an older bundle and holds no start time, so nothing proves "
            f"PID {service.pid} is still ours: left alone. If it is, stop it with: kill -TERM -- -{service.pid}")
        pid_file.unlink(missing_ok=True)
        return True
    if not service.alive():
        say(f"{name}: not running (removing stale PID file)")
        pid_file.unlink(missing_ok=True)
        return True
    stopped = stop(service, name, grace_s, say)
    if stopped:
        pid_file.unlink(missing_ok=True)
        say(f"{name}: stopped")
    return stopped


class NotReady(Exception):
    """The service died or did not answer in time; the message says which."""


def wait_ready(url: str, alive: Callable[[], bool], timeout_s: float, accept: Iterable[int] = (200,),
               name: str = "service", headers: dict[str, str] | None = None, trust: tls.Trust | None = None) -> float:
    """Poll `url` until it answers one of `accept`, while `alive()` holds; seconds waited.

    Raises NotReady as soon as the process is gone, at the deadline, or at once when the
    service's TLS certificate does not verify against `trust` (waiting would not change it).
    """
    accepted = set(accept)
    start = time.monotonic()
    request = urllib.request.Request(url, headers=headers or {})
    context = trust.ssl_context() if trust is not None else None
    while True:
        if not alive():
            raise NotReady(f"{name} exited during start-up")
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except (urllib.error.URLError, OSError) as exc:
            if isinstance(tls.ssl_error_of(exc), ssl.SSLCertVerificationError):
                raise NotReady(tls.explain(exc, url, trust or tls.Trust())) from None
            status = None
        if status in accepted:
            return time.monotonic() - start
        if time.monotonic() - start >= timeout_s:
            raise NotReady(f"{name} did not answer {url} within {timeout_s:g} s")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m ocr_bundle.serve.processes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    record = commands.add_parser("record", help="write PID and start time of a started service")
    record.add_argument("pid_file", type=Path, help="where to write them")
    record.add_argument("pid", type=positive_int, help="the service's PID (its process group id)")
    running = commands.add_parser("running", help="exit 0 and print the PID if the recorded service runs")
    running.add_argument("pid_file", type=Path, help="the service's PID file")
    ready = commands.add_parser("wait-ready", help="wait until URL answers, while the recorded service lives")
    ready.add_argument("url", help="what to poll, e.g. http://127.0.0.1:8000/health")
    ready.add_argument("--pid-file", type=Path, required=True, help="the service's PID file")
    ready.add_argument("--timeout", type=positive_number, default=900, help="seconds before giving up (default 900)")
    ready.add_argument("--accept", default="200", help="HTTP codes that mean up, comma-separated (default 200)")
    ready.add_argument("--name", default="the service", help="name used in messages")
    holder = commands.add_parser("hold-record", help="name the holder of a RUN_DIR lock in its lock file")
    holder.add_argument("lock_file", type=Path)
    holder.add_argument("what", choices=("start", "stop"))
    holder.add_argument("pid", type=positive_int)
    signal_it = commands.add_parser("signal-holder", help="signal the process a RUN_DIR lock file names, if still it")
    signal_it.add_argument("lock_file", type=Path)
    signal_it.add_argument("signal", choices=("TERM", "INT"))
    halt = commands.add_parser("stop", help="stop the recorded service's process group, remove the PID file")
    halt.add_argument("pid_file", type=Path, help="the service's PID file")
    halt.add_argument("--name", default="service", help="name used in messages")
    halt.add_argument("--grace", type=number_at_least_zero, default=30.0,
                      help="seconds between TERM and escalation (default 30)")
    args = parser.parse_args(argv)

    if args.command == "record":
        try:
            write_pid_file(args.pid_file, args.pid)
        except (ProcessLookupError, LiveServiceRecorded) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "hold-record":
        record_holder(args.lock_file, args.what, args.pid)
        return 0
    if args.command == "signal-holder":
        pid = signal_holder(args.lock_file, getattr(signal, f"SIG{args.signal}"))
        if pid is None:
            return 1
        print(pid)
        return 0
    if args.command == "running":
        service = read_pid_file(args.pid_file)
        if service is None or not service.alive():
            return 1
        print(service.pid)
        return 0
    if args.command == "wait-ready":
        service = read_pid_file(args.pid_file)
        if service is None:
            print(f"error: no PID in {args.pid_file}", file=sys.stderr)
            return 1
        try:
            waited = wait_ready(args.url, service.leader_alive, args.timeout,
                                [int(code) for code in args.accept.split(",")], args.name, trust=tls.machine_trust())
        except NotReady as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{args.name} ready after {waited:.0f} s")
        return 0
    return 0 if stop_recorded(args.pid_file, args.name, args.grace, lambda line: print(line, flush=True)) else 1


if __name__ == "__main__":
    sys.exit(main())
