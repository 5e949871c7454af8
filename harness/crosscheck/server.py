"""One llama-server process on 127.0.0.1: started, waited for (/health), asked (/completion), stopped whatever
happens. Traffic goes to 127.0.0.1 only, through http.client (no proxy), every wait bounded in time."""
from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from harness.errors import HarnessError

HOST = "127.0.0.1"
POLL_S = 0.25


def free_port() -> int:
    """A port nothing listens on now: the kernel's pick for port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def require_free(port: int) -> None:
    """--port N: refused in one line when something on this machine holds 127.0.0.1:N."""
    if not 0 < port < 65536:
        raise HarnessError(f"--port {port}: give a port from 1 to 65535 (or leave it out: a free one is picked)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError as e:
            raise HarnessError(f"--port {port}: {HOST}:{port} is in use ({e.strerror or e}): give another --port, "
                               "or leave it out and a free one is picked") from None


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the harness dies, even by SIGKILL (Linux prctl; elsewhere
    nothing)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# a line that says why a server stopped: arg.cpp's "error while handling argument", a failed GGML_ASSERT, an
# uncaught exception; what follows it (usage text, gdb's backtrace) does not
CAUSE = re.compile(r"\berror\b|GGML_ASSERT|terminate called|what\(\):", re.IGNORECASE)
LOG_READ = 4 << 20  # of a server's log, the bytes read for the line that says why


def why_line(path: Path, cause: re.Pattern | None = None) -> str:
    """The line of a server's log (its stderr and stdout) that says why it failed, for an error message: the first
    error or GGML_ASSERT line, else the last non-empty one. With `cause`: the first line it matches, else ""."""
    try:
        with open(path, "rb") as f:
            head = f.read(LOG_READ)
            f.seek(max(f.tell(), f.seek(0, 2) - 8192))
            tail = f.read()
    except OSError:
        return ""
    lines = [ln.strip() for ln in (head + tail).decode("utf-8", errors="replace").splitlines() if ln.strip()]
    last = "" if cause else lines[-1] if lines else ""
    return next((ln for ln in lines if (cause or CAUSE).search(ln)), last)[:300]


class Server:
    """llama-server with `args` on 127.0.0.1:`port`, its output in `log`. `role` names it in messages
    ("plain", "speculative"); on_spawn(pid) is told its pid as soon as it runs (bench's CPU meter counts it as the
    unit's own from its model load on)."""

    def __init__(self, binary: Path, args: list[str], port: int, log: Path, role: str, on_spawn=None):
        self.binary, self.args, self.port, self.log, self.role = binary, args, port, log, role
        self.on_spawn = on_spawn
        self.proc: subprocess.Popen | None = None

    @property
    def command(self) -> list[str]:
        return [str(self.binary), *self.args, "--host", HOST, "--port", str(self.port)]

    def _said(self) -> str:
        line = why_line(self.log)
        return f": {line}" if line else " (it printed nothing)"

    def start(self, timeout_s: float) -> None:
        """Start it and wait until /health answers ok; one line if it exits first or never answers."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        if self.on_spawn:
            self.on_spawn(self.proc.pid)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise HarnessError(f"llama-server ({self.role}) exited with code {rc} before it was ready"
                                   f"{self._said()} (log: {self.log})")
            if self._healthy():
                return
            time.sleep(POLL_S)
        self.stop()
        raise HarnessError(f"llama-server ({self.role}) did not answer /health on {HOST}:{self.port} within "
                           f"{timeout_s:g} s{self._said()}: is {self.binary} llama.cpp's llama-server? "
                           "(--start-timeout gives a slow model load longer)")

    def _healthy(self) -> bool:
        try:
            status, body = self._request("GET", "/health", None, 2.0)
        except (OSError, http.client.HTTPException):
            return False
        return status == 200 and body.get("status") == "ok"

    def _request(self, method: str, path: str, payload: dict | None, timeout_s: float) -> tuple[int, dict]:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout_s)
        try:
            data = None if payload is None else json.dumps(payload).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            body = json.loads(raw) if raw else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = {"_raw": raw[:200].decode("utf-8", errors="replace")}
        return resp.status, body if isinstance(body, dict) else {"_raw": str(body)[:200]}

    def complete(self, payload: dict, what: str, timeout_s: float) -> dict:
        """POST /completion; the response, or one line: the server died, timed out, or refused `what`."""
        try:
            status, body = self._request("POST", "/completion", payload, timeout_s)
        except (OSError, http.client.HTTPException) as e:
            time.sleep(POLL_S)  # a server that crashed: let its exit be seen
            rc = self.proc.poll() if self.proc else None
            if rc is not None:
                raise HarnessError(f"llama-server ({self.role}) died (exit code {rc}) while answering {what}"
                                   f"{self._said()} (log: {self.log})") from None
            if isinstance(e, (socket.timeout, TimeoutError)):
                raise HarnessError(f"llama-server ({self.role}) gave no answer to {what} within {timeout_s:g} s "
                                   "(--request-timeout gives it longer)") from None
            raise HarnessError(f"llama-server ({self.role}) on {HOST}:{self.port} failed on {what}: {e}") from None
        if status != 200:
            err = body.get("error")
            msg = err.get("message") if isinstance(err, dict) else (err or body.get("_raw") or "")
            raise HarnessError(f"llama-server ({self.role}) refused {what}: HTTP {status} {msg}".rstrip())
        return body

    def stop(self) -> None:
        """Terminate, then kill after 10 s; safe to call twice."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
