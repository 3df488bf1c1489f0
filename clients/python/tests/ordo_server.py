"""Runs a real `ordo serve` on loopback for the end-to-end tests, and talks to
its HTTP API with the standard library."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
ORDO_BIN = Path(os.environ.get("ORDO_BIN") or REPO / "target" / "release" / "ordo")
LISTENING = re.compile(r"listening on http://([0-9.]+):(\d+)")
START_TIMEOUT = 60.0


def ordo_help(*command: str) -> str:
    """What `ordo COMMAND --help` prints (its usage text; empty without a binary)."""
    if not ORDO_BIN.exists():
        return ""
    done = subprocess.run([str(ORDO_BIN), *command, "--help"], capture_output=True, timeout=60)
    return (done.stdout + done.stderr).decode(errors="replace")


def mint_token(secret_file: Path, sub: str, role: str, ttl: int = 60, **claims: str) -> str:
    """`ordo token --secret-file F --sub S --role R --ttl T [--claim k=v]...`: an HS256 JWT."""
    args = [str(ORDO_BIN), "token", "--secret-file", str(secret_file), "--sub", sub, "--role", role, "--ttl", str(ttl)]
    for key, value in claims.items():
        args += ["--claim", f"{key}={value}"]
    done = subprocess.run(args, capture_output=True, timeout=60, check=True)
    return done.stdout.decode().strip()


class OrdoServer:
    """`ordo serve --listen 127.0.0.1:PORT --data-dir DIR [extra_args]`; port 0
    picks one (read from the line it prints on stdout). HTTP requests carry
    `Authorization: Bearer <token>` when `token` is set."""

    def __init__(self, data_dir: Path, port: int = 0, extra_args: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = port
        self.extra_args = list(extra_args or [])
        self.token: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self._log_offset = 0

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    def start(self) -> None:
        if not ORDO_BIN.exists():
            raise RuntimeError(
                f"{ORDO_BIN} does not exist: build it with "
                "`cargo build --release -p ordo-server --bin ordo` or set ORDO_BIN"
            )
        log = self.log_path.open("ab")
        self._log_offset = log.tell()
        args = [str(ORDO_BIN), "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data_dir)]
        args += self.extra_args
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            text = self.log_path.read_bytes()[self._log_offset :].decode(errors="replace")
            found = LISTENING.search(text)
            if found:
                self.port = int(found.group(2))
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"ordo serve exited with {self.process.returncode}:\n{text}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ordo serve printed no `listening` line in {START_TIMEOUT} s:\n{text}")
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM, then wait for the process to end (SIGKILL past a deadline)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL (no clean close of any connection), then wait for the process to end."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # ---- HTTP -----------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        """`token`: the bearer token of this request (default: `self.token`; "" for none)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.http + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        token = self.token if token is None else token
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.request(method, path, body)
        assert 200 <= status < 300, f"{method} {path}: {status} {answer}"
        return answer

    def create_collection(self, name: str, fields: list[tuple[str, str]]) -> Any:
        return self.ok("PUT", f"/v1/collections/{name}", {"fields": [{"name": n, "type": t} for n, t in fields]})

    def batch(self, collection: str, ops: list[dict[str, Any]]) -> Any:
        return self.ok("POST", f"/v1/collections/{collection}/batch", {"ops": ops})

    def query(self, collection: str, view: dict[str, Any]) -> list[dict[str, Any]]:
        body = {key: value for key, value in view.items() if value is not None}
        items: list[dict[str, Any]] = self.ok("POST", f"/v1/collections/{collection}/query", body)["items"]
        # Query items and items in diff frames both carry their version (the window digest covers it).
        return items
