"""Helpers the benches share: child processes on loopback, their CPU time and RSS from /proc."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")

# A minimal OTLP/HTTP receiver in its own process: answers 200 to every POST (its CPU is not ours).
OTLP_SINK = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> int:
    """The first of `n` consecutive free loopback ports."""
    for _ in range(200):
        base = free_port()
        if base + n > 65000:
            continue
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports")


def cpu_seconds(pid: int) -> float:
    """The process's CPU time, all its threads, those that ended too: its CPU clock in nanoseconds (Linux's
    process clock of another pid, clock_getcpuclockid(3): ((~pid) << 3) | 2), else utime + stime in ticks."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except OSError:
        return 0, b""


def wait_for(url: str, deadline_s: float = 60.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + deadline_s
    while get(url, 2)[0] != 200:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} never answered")
        time.sleep(0.02)


def start_simulators(endpoints: int, gpus: int, *extra: str) -> tuple[subprocess.Popen[bytes], list[str]]:
    base = free_ports(endpoints)
    proc = subprocess.Popen([sys.executable, "-m", "bridge.cli", "simulate", "--port", str(base), "--gpus", str(gpus),
                             "--endpoints", str(endpoints), *extra], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    urls = [f"http://127.0.0.1:{base + i}/metrics" for i in range(endpoints)]
    for url in urls:
        wait_for(url, 60, proc)
    return proc, urls


def start_page_server(endpoints: int, gpus: int) -> tuple[subprocess.Popen[bytes], list[str]]:
    """The simulator's pages, pre-rendered (bench/_pages.py): `endpoints` nodes of `gpus` GPUs on consecutive
    ports, served by one process at a fraction of the live simulator's CPU (a page is rendered once per ring)."""
    base = free_ports(endpoints)
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "_pages.py"), str(base), str(endpoints), str(gpus)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    urls = [f"http://127.0.0.1:{base + i}/metrics" for i in range(endpoints)]
    for url in urls:
        wait_for(url, 60, proc)
    return proc, urls


def start_otlp_sink() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", OTLP_SINK, str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_for_port(port, proc)
    return proc, f"http://127.0.0.1:{port}/v1/metrics"


def wait_for_port(port: int, proc: subprocess.Popen[bytes], deadline_s: float = 30.0) -> None:
    """Until something accepts connections on the loopback port (`proc`, which must not exit meanwhile)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"
