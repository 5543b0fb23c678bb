"""Real object-storage servers for the tests: moto's S3 server and Azurite, on 127.0.0.1.

Each server gets a free port once and keeps it: ``stop()`` then ``start()`` brings it back on
the same port with its data intact, which is what the outage tests need. Nothing here skips: a
server that cannot start raises :class:`ServerStartError` with the reason (and Azurite's log).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

HOST = "127.0.0.1"
AZURITE_DIR = Path(__file__).resolve().parent / "azurite"
AZURITE_BIN = AZURITE_DIR / "node_modules" / ".bin" / "azurite-blob"
AZURITE_ACCOUNT = "devstoreaccount1"
# The well-known, published development key of Azurite's default account (not a secret).
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
START_TIMEOUT = 30.0


class ServerStartError(RuntimeError):
    """A test server did not come up."""


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_open(port: int, timeout: float = 0.2) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=timeout):
        return True
    return False


def _wait(predicate: Callable[[], bool], what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise ServerStartError(f"{what} within {timeout:.0f} s")


class MotoS3Server:
    """moto's ``ThreadedMotoServer`` (S3 and IAM) in this process, on a fixed free port.

    moto keeps its backends in module globals, so buckets survive ``stop()``/``start()``, and
    every moto server in one process shares them (and the IAM-enforcement switch).
    """

    def __init__(self, port: int | None = None) -> None:
        self.host = HOST
        self.port = port or free_port()
        self._server: object | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        if self._server is not None:
            return
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        try:
            server.start()
        except OSError as exc:
            raise ServerStartError(f"moto S3 server on {self.endpoint_url}: {exc}") from exc
        self._server = server
        _wait(lambda: port_open(self.port), f"moto S3 server on {self.endpoint_url} not up")

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.stop()  # type: ignore[attr-defined]
        # ThreadedMotoServer.stop() only ends serve_forever(); the listening socket stays bound
        # (clients would hang instead of being refused, and a restart could not bind). Close it.
        wsgi_server = getattr(server, "_server", None)
        if wsgi_server is not None:
            wsgi_server.server_close()
        _wait(lambda: not port_open(self.port), f"moto S3 server on {self.endpoint_url} not down")

    def _post(self, path: str, body: bytes = b"") -> bytes:
        url = self.endpoint_url + path  # always http://127.0.0.1:<port>/...
        # text/plain: with urllib's default form type, werkzeug eats the body as form fields.
        request = urllib.request.Request(  # noqa: S310
            url, data=body, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return bytes(response.read())

    def enforce_auth(self, after_requests: int = 0) -> None:
        """Check IAM signatures and policies on every request after the next ``after_requests``."""
        self._post("/moto-api/reset-auth", str(after_requests).encode())

    def disable_auth(self) -> None:
        """moto's default: every request is allowed, any key is accepted."""
        self._post("/moto-api/reset-auth", b"inf")


class AzuriteServer:
    """Azurite's blob service (``azurite-blob``) as a child process, on a fixed free port.

    Data lives under ``location`` (a temporary directory by default), so containers survive
    ``stop()``/``start()``. ``close()`` stops the process and removes that directory.
    """

    def __init__(self, port: int | None = None, location: Path | None = None) -> None:
        self.host = HOST
        self.port = port or free_port()
        self._own_location = location is None
        self.location = location or Path(tempfile.mkdtemp(prefix="azurite-"))
        self.log_path = self.location / "azurite.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def account_url(self) -> str:
        return f"http://{self.host}:{self.port}/{AZURITE_ACCOUNT}"

    @property
    def endpoint_url(self) -> str:
        return self.account_url

    @property
    def connection_string(self) -> str:
        return self.connection_string_with_key(AZURITE_KEY)

    def connection_string_with_key(self, key: str) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
            f"BlobEndpoint={self.account_url};"
        )

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _command(self) -> list[str]:
        if not AZURITE_BIN.exists():
            raise ServerStartError(
                f"{AZURITE_BIN} is missing: run `npm ci --prefix tests/azurite` (make test does)"
            )
        node = shutil.which("node")
        if node is None:
            raise ServerStartError("node is not on PATH: Azurite needs Node.js 20")
        return [
            str(AZURITE_BIN),
            "--blobHost",
            self.host,
            "--blobPort",
            str(self.port),
            "--location",
            str(self.location),
            "--skipApiVersionCheck",
            "--disableTelemetry",
            "--silent",
        ]

    def start(self) -> None:
        if self.running:
            return
        command = self._command()
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.location,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise ServerStartError(
                    f"azurite-blob exited with code {code} before listening on port "
                    f"{self.port}: {self._log_tail()}"
                )
            if port_open(self.port) and self._answers():
                return
            time.sleep(0.1)
        self.stop()
        raise ServerStartError(
            f"azurite-blob not listening on port {self.port} within {START_TIMEOUT:.0f} s: "
            f"{self._log_tail()}"
        )

    def _answers(self) -> bool:
        """Any HTTP answer (even 4xx) means the blob service is serving requests."""
        try:
            with urllib.request.urlopen(  # noqa: S310
                f"{self.account_url}?comp=list", timeout=1
            ):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip()
        except OSError:
            return "(no log)"
        return text[-2000:] or "(empty log)"

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            # azurite-blob is a node script: signal its own process group (it started one).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        _wait(lambda: not port_open(self.port), f"azurite on port {self.port} not down")

    def close(self) -> None:
        self.stop()
        if self._own_location:
            shutil.rmtree(self.location, ignore_errors=True)
