"""A real ``provisioner console`` process for tests, and plain HTTP requests to it."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row

from provisioner.settings import Settings
from tests.conftest import Database, settings_env
from tests.workers import wait_until

__all__ = ["Console", "consoles", "request", "runs_started_by"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def request(
    port: int, method: str, path: str, body: str = "", **headers: str
) -> tuple[int, str, dict[str, str]]:
    """One HTTP request to the console on 127.0.0.1: status, body, headers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        if body or method == "POST":
            headers = {"Content-Type": "application/x-www-form-urlencoded", **headers}
        conn.request(method, path, body=body.encode() or None, headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode(), dict(response.getheaders())
    finally:
        conn.close()


class Console:
    """A ``provisioner console`` process on a free port of 127.0.0.1."""

    def __init__(self, settings: Settings, log: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        child_env = {**settings_env(settings), **env}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "provisioner", "console", "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env,
                start_new_session=True,
            )
        self.log = log

        def up() -> bool:
            assert self.proc.poll() is None, log.read_text()
            try:
                return request(self.port, "GET", "/pool")[0] == 200
            except OSError:
                return False

        wait_until(up, 30, "the console to answer")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def consoles(tmp_path: Path) -> Iterator[list[Console]]:
    started: list[Console] = []
    yield started
    for console in started:
        console.stop()


def runs_started_by(database: Database, tenant: str) -> list[str]:
    with psycopg.connect(database.owner_url, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT r.started_by FROM control.job_runs r JOIN control.platform_jobs j "
            "ON j.id = r.job_id WHERE j.tenant_id = %s ORDER BY r.started_at, r.run",
            (tenant,),
        ).fetchall()
    return [r["started_by"] for r in rows]
