"""Real ``provisioner worker`` processes for the worker and wake scenarios, and the bench-only
instrumentation that times their claims.

The claim moment is recorded by a trigger the benchmark adds to its own throwaway database: when
a job turns ``running``, ``clock_timestamp()`` goes into ``public.bench_claims``. That is the
claim statement's own execution time, to the microsecond, on the same clock as the
benchmark's ``time.time()``; the worker's code and SQL are untouched.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any

import psycopg

from bench.cluster import BenchDatabase

INSTRUMENT = """
CREATE TABLE public.bench_claims (job_id uuid PRIMARY KEY, claimed_at timestamptz NOT NULL);
CREATE FUNCTION public.bench_record_claim() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF NEW.status = 'running' AND OLD.status IS DISTINCT FROM 'running' THEN
        INSERT INTO public.bench_claims VALUES (NEW.id, clock_timestamp())
        ON CONFLICT (job_id) DO NOTHING;
    END IF;
    RETURN NEW;
END
$$;
GRANT SELECT ON public.bench_claims TO app_rw;
CREATE TRIGGER bench_claims AFTER UPDATE OF status ON control.platform_jobs
    FOR EACH ROW EXECUTE FUNCTION public.bench_record_claim();
"""


def instrument(database: BenchDatabase) -> None:
    with psycopg.connect(database.owner_url, autocommit=True) as conn:
        conn.execute(INSTRUMENT)


def worker_available() -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "provisioner", "worker", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.returncode == 0 and "--once" in out.stdout


class WorkerProcess:
    """``python -m provisioner worker ARGS`` with JSON logs going to a file (a pipe nobody
    reads would fill up and block the worker's logging)."""

    def __init__(
        self, database: BenchDatabase, *args: str, env: dict[str, str] | None = None
    ) -> None:
        self.log_path = database.objects.parent / f"worker-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "provisioner", "worker", "--log-format", "json", *args],
            env=database.env(**(env or {})),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.stop()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a clean drain), then wait; SIGKILL if it does not stop."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def close(self) -> None:
        self.stop()
        self._log.close()


def wait_for(condition: Any, timeout: float, step: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return False
