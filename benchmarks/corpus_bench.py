"""The converter on a real-world corpus at scale, on CPU (docs/benchmarks.md, "A large corpus").

Many stand-in servers (tests/scripted_server.py, one reply per page naming the page it read) behind
the bundle's real gateway (SMG, joined through ocr_bundle.serve.membership), many converters with
--shard on one generated corpus of small pages in nested folders, with what real trees hold:
annex-style symbolic links (two links to one file: two documents), a linked folder outside the
corpus, two symlink loops, a 240-byte name, half the converters reading the corpus through another
mount point (a bind mount in a mount namespace of their own). Mid-run: a file replaced by a longer
version, a quarter of the servers SIGKILLed, two converters SIGKILLed. Then those two shards again,
then all shards again (a no-op but for the replaced file), --status from the other mount, and the
check that every page's text is in its document's .md exactly once, in order.

    python benchmarks/corpus_bench.py --work /tmp/corpus-bench                 # 10,000 documents, 100,000 pages
    python benchmarks/corpus_bench.py --work /tmp/c --docs 200 --pages 5 --servers 8 --converters 4 --kill-after 3
    python benchmarks/corpus_bench.py noop --work /tmp/c300k --docs 30000 --pages 10   # one converter's no-op rerun

Each page is a 32x24 image whose first pixel holds its number (lossless TIFF in, PNG on the wire:
the stand-in reads the number back and answers "Page p0001234 ..."). Needs root (or user
namespaces) for the bind mount; the report is printed and written to WORK/report.json.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from ocr_bundle.batch.identity import stem_of  # noqa: E402
from ocr_bundle.serve.membership import Gateway  # noqa: E402

ADMIN_KEY = "corpus-bench-admin"  # a local benchmark's own gateway, exported to it, never on a command line
LONG_NAME = "長" * 78 + ".tif"  # 238 bytes: the converter's temporary names must stay under 255
REPLACED_OFFSET = 50_000_000  # the replaced file's pages are numbered from here


def page_image(number: int) -> Image.Image:
    image = Image.new("RGB", (32, 24), "white")
    image.putpixel((0, 0), (number & 255, (number >> 8) & 255, (number >> 16) & 255))
    image.putpixel((1, 0), (number >> 24 & 255, 7, 7))
    return image


def number_in(data_url: str) -> int:
    image = Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))).convert("RGB")
    (r, g, b), (top, _, _) = image.getpixel((0, 0)), image.getpixel((1, 0))
    return r | g << 8 | b << 16 | top << 24


def page_text(number: int) -> str:
    return f"Page p{number:09d} of the corpus bench."


PAGE_TOKEN = re.compile(r"p(\d{9}) of the corpus bench")


def write_document(path: Path, numbers: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = [page_image(n) for n in numbers]
    frames[0].save(path, save_all=True, append_images=frames[1:])


# ------------------------------------------------------------------ the corpus

@dataclass
class Corpus:
    root: Path  # WORK/corpus
    alias: Path  # where the other converters see it (bind mount)
    expected: dict[str, list[int]] = field(default_factory=dict)  # relative path -> page numbers
    replaced: str = ""  # the relative path replaced mid-run

    @property
    def pages(self) -> int:
        return sum(map(len, self.expected.values()))


def make_corpus(work: Path, docs: int, pages: int) -> Corpus:
    """`docs` documents of `pages` pages in corpus/dNN/sNN/, plus what real trees hold."""
    corpus = Corpus(work / "corpus", work / "mnt-b")
    corpus.alias.mkdir(parents=True, exist_ok=True)
    if corpus.root.exists():
        raise SystemExit(f"error: {corpus.root} exists: give a fresh --work")
    number = 0

    def document(relative: str, at: Path | None = None, count: int = pages) -> list[int]:
        nonlocal number
        numbers = list(range(number, number + count))
        number += count
        write_document(at or corpus.root / relative, numbers)
        return numbers

    for d in range(docs):
        relative = f"d{d // 1000:02d}/s{d // 100 % 10:02d}/doc{d:05d}.tif"
        corpus.expected[relative] = document(relative)
    store = work / "store"  # git-annex style: two links to one content, named by the links
    for i in range(10):
        target = store / f"SHA256E-s1234--{i:04d}ab12.tif"
        numbers = document("", target)
        for name in (f"invoice-{i}.tif", f"invoice-{i}-copy.tif"):
            link = corpus.root / "d00" / "annex" / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(Path("../../../store") / target.name)
            corpus.expected[f"d00/annex/{name}"] = numbers
    extra = work / "extra"  # a folder outside the corpus, linked into it
    for i in range(20):
        corpus.expected[f"linked/extra-{i:02d}.tif"] = document("", extra / f"extra-{i:02d}.tif")
    (corpus.root / "linked").symlink_to(extra)
    (corpus.root / "d00" / "self").symlink_to(".")  # loops: followed once, never forever
    (corpus.root / "d00" / "s00" / "up").symlink_to("../..")
    corpus.expected[f"d00/{LONG_NAME}"] = document(f"d00/{LONG_NAME}")
    corpus.replaced = next(relative for relative in corpus.expected if relative.endswith(f"doc{docs // 2:05d}.tif"))
    return corpus


def replace_document(corpus: Corpus) -> None:
    """A longer version over a document, as a scanner rewriting a file does (a new file renamed over it)."""
    numbers = list(range(REPLACED_OFFSET, REPLACED_OFFSET + len(corpus.expected[corpus.replaced]) + 3))
    target = corpus.root / corpus.replaced
    fresh = target.with_name(".replacing.tif")
    write_document(fresh, numbers)
    os.replace(fresh, target)
    corpus.expected[corpus.replaced] = numbers


# ------------------------------------------------------------------ servers and the gateway

def serve(count: int) -> None:
    """`count` stand-in servers in this process; their URLs on stdout, then serve until killed."""
    from scripted_server import ChatRequest, Reply, ScriptedServer

    class Standin(ScriptedServer):
        def _record(self, body: dict, headers: dict) -> ChatRequest:  # a count, not a list: 100,000s of requests
            return ChatRequest(0, body, headers)

    servers = [Standin(responder=lambda request: Reply(text=page_text(number_in(request.image_url)))).__enter__()
               for _ in range(count)]
    print(" ".join(server.url for server in servers), flush=True)
    threading.Event().wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"error: {what} not after {timeout_s:g} s")
        time.sleep(0.2)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@dataclass
class Cluster:
    gateway_url: str
    gateway: subprocess.Popen
    server_groups: list[subprocess.Popen]

    def stop(self) -> None:
        for process in [self.gateway, *self.server_groups]:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()


def start_cluster(work: Path, servers: int, groups: int) -> Cluster:
    port = free_port()
    environment = {**os.environ, "ROUTER_ADMIN_KEY": ADMIN_KEY, "VLLM_API_KEY": ""}
    log = open(work / "gateway.log", "w")  # noqa: SIM115 (the process's life)
    gateway = subprocess.Popen([sys.executable, "-m", "ocr_bundle.serve.gateway", "--host", "127.0.0.1", "--port",
                                str(port), "--metrics-port", str(free_port())], cwd=ROOT, env=environment,
                               stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    group_processes, urls = [], []
    for _ in range(groups):
        process = subprocess.Popen([sys.executable, __file__, "serve", "--count", str(servers // groups)],
                                   stdout=subprocess.PIPE, text=True)
        group_processes.append(process)
        urls += process.stdout.readline().split()
    wait_until(lambda: answers(url + "/liveness"), 60, "the gateway answering")
    pool = Gateway(url, ADMIN_KEY)
    with ThreadPoolExecutor(16) as workers:
        list(workers.map(lambda server: pool.add(server, wait_s=60), urls))
    return Cluster(url, gateway, group_processes)


# ------------------------------------------------------------------ converters

def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Converter:
    name: str
    process: subprocess.Popen
    started: float
    log: Path
    peak_mb: float = 0.0
    seconds: float = 0.0
    summary: str = ""

    def sample(self) -> None:
        self.peak_mb = max(self.peak_mb, peak_rss_mb(self.process.pid) or 0.0)

    def done(self) -> bool:
        if self.process.poll() is None:
            return False
        if not self.seconds:
            self.seconds = time.monotonic() - self.started
            output = self.log.read_text(errors="replace")
            self.summary = " | ".join(line.strip() for line in output.splitlines()
                                      if re.match(r"\s*(pages|documents|time|error)", line.strip()))[:400]
        return True


def in_alias(corpus: Corpus, command: list[str]) -> list[str]:
    """`command` in a mount namespace of its own where the corpus is also at corpus.alias."""
    return ["unshare", "-rm", "sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh",
            str(corpus.root), str(corpus.alias), *command]


def converter(corpus: Corpus, out: Path, url: str, shard: str | None, via_alias: bool, concurrency: int) -> Converter:
    command = [sys.executable, str(ROOT / "batch_ocr.py"), str(corpus.alias if via_alias else corpus.root),
               "--url", url, "--out", str(out), "--quiet", "--concurrency", str(concurrency), "--render-workers", "1",
               "--max-attempts", "3", *(["--shard", shard] if shard else [])]
    name = f"{shard or 'all'}{' (mount B)' if via_alias else ''}"
    log = out.parent / "logs" / f"{name.split()[0].replace('/', 'of')}-{time.monotonic_ns()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as handle:  # a file, not a pipe: a converter never waits on a reader
        process = subprocess.Popen(in_alias(corpus, command) if via_alias else command, cwd=ROOT, stdout=handle,
                                   stderr=subprocess.STDOUT, env={**os.environ, "VLLM_API_KEY": ""})
    return Converter(name, process, time.monotonic(), log)


def watch(converters: list[Converter], events: list[tuple[float, object]] = ()) -> None:
    """Sample each converter's peak RSS until all have exited; run each event when its time comes."""
    start, pending = time.monotonic(), sorted(events, key=lambda event: event[0])
    while not all(c.done() for c in converters):
        for c in converters:
            if c.process.poll() is None:
                c.sample()
        while pending and time.monotonic() - start >= pending[0][0]:
            pending.pop(0)[1]()
        time.sleep(0.25)


# ------------------------------------------------------------------ the check

def check_every_page_once(corpus: Corpus, out: Path) -> dict:
    """Each document's .md holds each of its pages' text exactly once, in page order, and the output
    tree holds no other document."""
    problems, outputs = [], {p.parent.relative_to(out).as_posix() for p in out.rglob("manifest.json")}
    for relative, numbers in corpus.expected.items():
        md = out / relative / f"{stem_of({'relative': relative})}.md"
        found = [int(n) for n in PAGE_TOKEN.findall(md.read_text())] if md.exists() else []
        if found != numbers:
            problems.append(f"{relative}: {len(found)} page texts, expected {len(numbers)}"
                            f"{' (not in order or repeated)' if sorted(set(found)) != found else ''}")
    extra = sorted(outputs - set(corpus.expected))
    return {"documents": len(corpus.expected), "pages": corpus.pages, "documents_wrong": len(problems),
            "problems": problems[:10], "outputs_not_in_corpus": extra[:10], "every_page_once": not problems and not extra}


def status(corpus: Corpus, out: Path) -> dict:
    command = in_alias(corpus, [sys.executable, str(ROOT / "batch_ocr.py"), "--status", str(out), str(corpus.alias)])
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return {"seconds": round(time.monotonic() - start, 1), "exit": done.returncode,
            "verdict": lines[-1] if lines else done.stderr[-300:]}


# ------------------------------------------------------------------ the run

def row(phase: str, converters: list[Converter]) -> dict:
    """The phase's wall time, the pages its converters said they converted (a killed one says
    nothing) and their rate, each converter's peak RSS."""
    seconds = max(c.seconds for c in converters)
    said = [re.search(r"pages: (\d+) converted", c.summary) for c in converters]
    converted = sum(int(match[1]) for match in said if match)
    return {"phase": phase, "converters": len(converters), "seconds": round(seconds, 1),
            "pages_converted_by_those_that_finished": converted, "pages_per_s": round(converted / seconds, 1),
            "peak_rss_mb": {c.name: round(c.peak_mb, 1) for c in converters},
            "exits": [c.process.returncode for c in converters], "summaries": {c.name: c.summary for c in converters}}


def phase(report: dict, name: str, converters: list[Converter], events: list[tuple[float, object]] = ()) -> None:
    """Run `converters` to the end (and the events on time), then add the phase's row to the report."""
    watch(converters, events)
    report["phases"].append(row(name, converters))
    print(f"[bench] {report['phases'][-1]}", flush=True)


def verdict(report: dict, corpus: Corpus, out: Path) -> dict:
    """--status from the other mount, and every page's text once in its document's .md."""
    report["status_from_mount_b"] = status(corpus, out)
    report["check"] = check_every_page_once(corpus, out)
    return report


def run(args: argparse.Namespace) -> dict:
    work, n = args.work, args.converters
    start = time.monotonic()
    corpus = make_corpus(work, args.docs, args.pages)
    print(f"[bench] corpus: {len(corpus.expected):,} documents, {corpus.pages:,} pages "
          f"({time.monotonic() - start:.0f} s)", flush=True)
    out = work / "out"
    cluster = start_cluster(work, args.servers, args.server_groups)
    print(f"[bench] {args.servers} stand-in servers joined the gateway at {cluster.gateway_url}", flush=True)
    report: dict = {"documents": len(corpus.expected), "pages": corpus.pages, "servers": args.servers,
                    "converters": n, "cpus": os.cpu_count(), "replaced_mid_run": corpus.replaced, "phases": []}
    try:
        shards = [f"{k}/{n}" for k in range(1, n + 1)]
        first = [converter(corpus, out, cluster.gateway_url, shard, k % 2 == 1, args.concurrency)
                 for k, shard in enumerate(shards)]
        killed = [first[2], first[5 % n]]
        events = [(args.kill_after * 0.6, lambda: replace_document(corpus)),
                  (args.kill_after, lambda: cluster.server_groups[0].send_signal(signal.SIGKILL)),
                  (args.kill_after * 1.2, lambda: [c.process.send_signal(signal.SIGKILL) for c in killed])]
        phase(report, "all shards at once (2 converters and 1/4 of the servers SIGKILLed)", first, events)
        again = [converter(corpus, out, cluster.gateway_url, c.name.split()[0], "mount B" in c.name,
                           args.concurrency) for c in killed]
        phase(report, "the two killed shards again", again)
        converting_s = report["phases"][0]["seconds"] + report["phases"][1]["seconds"]
        report["every_page_converted"] = {"seconds": round(converting_s, 1),
                                          "pages_per_s": round(corpus.pages / converting_s, 1)}
        rerun = [converter(corpus, out, cluster.gateway_url, shard, k % 2 == 0, args.concurrency)
                 for k, shard in enumerate(shards)]
        phase(report, "every shard again, the other mount each (no-op but the replaced file)", rerun)
    finally:
        cluster.stop()
    return verdict(report, corpus, out)


def noop(args: argparse.Namespace) -> dict:
    """The corpus converted by every shard at once, then one converter over all of it: a no-op rerun
    (its peak RSS is the figure); then --status."""
    corpus = make_corpus(args.work, args.docs, args.pages)
    out = args.work / "out"
    cluster = start_cluster(args.work, args.servers, args.server_groups)
    report: dict = {"documents": len(corpus.expected), "pages": corpus.pages, "cpus": os.cpu_count(), "phases": []}
    try:
        shards = [converter(corpus, out, cluster.gateway_url, f"{k}/{args.converters}", False, args.concurrency)
                  for k in range(1, args.converters + 1)]
        phase(report, "first run, every shard at once", shards)
        one = [converter(corpus, out, cluster.gateway_url, None, False, args.concurrency)]
        phase(report, "no-op rerun, one converter over the whole corpus", one)
    finally:
        cluster.stop()
    return verdict(report, corpus, out)


def main() -> int:
    if sys.argv[1:2] == ["serve"]:
        serve(int(sys.argv[sys.argv.index("--count") + 1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", choices=("shards", "noop"), default="shards")
    parser.add_argument("--work", type=Path, required=True, help="a folder for the corpus, outputs and report")
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--pages", type=int, default=10, help="pages per document")
    parser.add_argument("--servers", type=int, default=64)
    parser.add_argument("--server-groups", type=int, default=4, help="processes the servers run in (one is killed)")
    parser.add_argument("--converters", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight per converter")
    parser.add_argument("--kill-after", type=float, default=60.0,
                        help="seconds into the run when a server group is SIGKILLed (the file is replaced at 0.6x, "
                             "two converters SIGKILLed at 1.2x)")
    args = parser.parse_args()
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    report = noop(args) if args.mode == "noop" else run(args)
    (args.work / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(json.dumps({k: v for k, v in report.items() if k != "phases"}, indent=1, ensure_ascii=False))
    return 0 if report["check"]["every_page_once"] and report["status_from_mount_b"]["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
