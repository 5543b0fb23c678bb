"""The console's ASGI app: its routes, the pages rendered from Jinja templates (autoescaped:
tenant ids and error details are data, never markup), the actions behind the guard, and the
headers every answer carries.

Each page is also served as a fragment (``?fragment=1``, just its live part): ``live.js``, a
few lines of plain JavaScript served from here, fetches it every few seconds and puts it in
place, so progress moves without a reload and without any script from elsewhere.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from provisioner import service
from provisioner.console import pages
from provisioner.console.guard import SESSION_COOKIE, SESSION_SECONDS, Guard
from provisioner.engine.holder import holder_id
from provisioner.errors import InvalidInput, ProvisionerError, UnknownJob, UnknownTenant
from provisioner.kinds.lifecycle import RESTORE_JOB_TYPE, SUSPEND_JOB_TYPE
from provisioner.settings import Settings

#: What every action records as the origin of the runs it starts.
STARTED_BY = "console"
#: How long a lifecycle action waits for a tenant busy with another job under a live holder (a
#: move's copy lasts hours), then answers 409 "busy": the actions run one at a time, and one
#: request waiting for ever held every other (the cancel that would free the tenant too).
BUSY_WAIT_SECONDS = 5.0

#: Sent with every answer: nothing runs but this origin's own script, no other site frames it.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


class SecurityHeaders:
    """A pure ASGI middleware adding :data:`SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def _ago(value: datetime | None) -> str:
    """How long ago a database timestamp was, by this host's clock: one that runs behind the
    database's would show a time ahead as "-4 s ago", shown as "just now" instead."""
    if value is None:
        return "-"
    seconds = (datetime.now(UTC) - value).total_seconds()
    if seconds < 1:
        return "just now"
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _seconds(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "-"
    return f"{(end - start).total_seconds():.3f} s"


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("provisioner.console", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["ago"] = _ago
    env.globals["seconds"] = _seconds
    env.filters["when"] = lambda v: v.strftime("%Y-%m-%d %H:%M:%S") if v else "-"
    return env


class Console:
    """The app's state: the settings, the guard, the templates; one action at a time."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.guard = Guard(settings.console_token)
        self.templates = _environment()
        self._acting = threading.Lock()

    # -- rendering ------------------------------------------------------------------------------

    def render(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> HTMLResponse:
        fragment = request.query_params.get("fragment") == "1"
        template = self.templates.get_template(name)
        html = template.render(
            **context,
            fragment=fragment,
            path=request.url.path,
            writable=self.guard.writable,
            csrf=self.guard.csrf_token(request),
        )
        return HTMLResponse(html, status_code=status)

    def page(
        self, name: str, read: Callable[[Request], dict[str, Any]]
    ) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                context = await run_in_threadpool(read, request)
            except (UnknownTenant, UnknownJob) as exc:
                return self.message(request, 404, str(exc))
            except InvalidInput as exc:
                return self.message(request, 400, str(exc))
            except ProvisionerError as exc:
                return self.message(request, 503, f"cannot read the fleet: {exc}")
            return self.render(request, name, context)

        return endpoint

    def message(self, request: Request, status: int, text: str) -> HTMLResponse:
        referer = urlsplit(request.headers.get("referer", ""))
        own = referer.netloc == request.headers.get("host") and referer.path.startswith("/")
        back = referer.path + (f"?{referer.query}" if referer.query else "") if own else "/"
        return self.render(request, "message.html", {"text": text, "back": back}, status)

    # -- login ----------------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        return self.render(request, "login.html", {"error": None})

    async def login(self, request: Request) -> Response:
        form = await _form(request)
        if not Guard.same_origin(request):
            return self.message(request, 403, "refused: this request did not come from the console")
        if not self.guard.writable:
            return self.message(request, 403, "the console is read-only: no token is set")
        if not self.guard.token_matches(form.get("token", "")):
            return self.render(request, "login.html", {"error": "wrong token"}, 403)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            self.guard.new_session(),
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(self, request: Request) -> Response:
        if not Guard.same_origin(request):
            return self.message(request, 403, "refused: this request did not come from the console")
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE, httponly=True, samesite="strict")
        return response

    # -- actions --------------------------------------------------------------------------------

    def action(self, run: Callable[[Request], str]) -> Callable[[Request], Any]:
        """A POST endpoint: refused unless the guard allows it; ``run`` returns what it did."""

        async def endpoint(request: Request) -> Response:
            form = await _form(request)
            refusal = self.guard.refuse(request, form)
            if refusal is not None:
                return self.message(request, refusal.status, refusal.message)
            try:
                done = await run_in_threadpool(self._one_at_a_time, run, request)
            except ProvisionerError as exc:
                return self.message(request, 400 if exc.exit_code == 2 else 409, str(exc))
            return self.message(request, 200, done)

        return endpoint

    def _one_at_a_time(self, run: Callable[[Request], str], request: Request) -> str:
        with self._acting:
            return run(request)

    def retry(self, request: Request) -> str:
        job = service.retry_job(self.settings, request.path_params["job_id"], started_by=STARTED_BY)
        return (
            f"job {job.id} ({job.job_type} of {job.tenant_id or '-'}) queued again: run {job.run}"
        )

    def cancel(self, request: Request) -> str:
        job = service.cancel_job(
            self.settings, request.path_params["job_id"], cancelled_by=STARTED_BY
        )
        return f"job {job.id} ({job.job_type} of {job.tenant_id or '-'}) cancelled"

    def lifecycle(self, job_type: str) -> Callable[[Request], str]:
        def run(request: Request) -> str:
            result = service.change_lifecycle(
                self.settings,
                request.path_params["tenant"],
                job_type,
                holder=holder_id("console"),
                started_by=STARTED_BY,
                busy_wait=BUSY_WAIT_SECONDS,
            )
            if result.already:
                return f"tenant {result.tenant} is already {result.state}"
            job = result.job
            outcome = job.status.value if job else "-"
            return f"tenant {result.tenant} is {result.state} ({job_type} {outcome})"

        return run

    def resume(self, request: Request) -> str:
        resumed = service.upgrade_resume(self.settings, started_by=STARTED_BY)
        return (
            f"rollout {resumed.rollout.id} resumed: {resumed.queued} tenant(s) queued, "
            f"{resumed.released} released"
        )

    def pause(self, request: Request) -> str:
        rollout_id = _rollout_id(request)
        paused = service.rollout_pause(self.settings, rollout_id, paused_by=STARTED_BY)
        return (
            f"rollout {paused.rollout.id} paused: {paused.held} queued job(s) held, "
            f"{paused.running} running job(s) finish"
        )

    def abort(self, request: Request) -> str:
        aborted = service.upgrade_abort(self.settings, ended_by=STARTED_BY)
        return f"rollout {aborted.rollout.id} aborted: {aborted.dropped_jobs} job(s) dropped"

    # -- the app --------------------------------------------------------------------------------

    def app(self) -> ASGIApp:
        settings = self.settings

        def open_tenant(request: Request) -> Response:
            wanted = request.query_params.get("id", "").strip()
            return RedirectResponse(f"/tenants/{quote(wanted, safe='')}", status_code=303)

        routes = [
            Route("/", self.page("fleet.html", lambda r: pages.fleet(settings))),
            Route("/rollouts", self.page("rollouts.html", lambda r: pages.rollouts(settings))),
            Route("/queue", self.page("queue.html", lambda r: pages.queue(settings))),
            Route("/pool", self.page("pool.html", lambda r: pages.pool(settings))),
            Route("/servers", self.page("servers.html", lambda r: pages.servers(settings))),
            Route("/tenant", open_tenant),
            Route(
                "/tenants/{tenant}",
                self.page("tenant.html", lambda r: pages.tenant(settings, r.path_params["tenant"])),
            ),
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/jobs/{job_id}/retry", self.action(self.retry), methods=["POST"]),
            Route("/jobs/{job_id}/cancel", self.action(self.cancel), methods=["POST"]),
            Route(
                "/tenants/{tenant}/suspend",
                self.action(self.lifecycle(SUSPEND_JOB_TYPE)),
                methods=["POST"],
            ),
            Route(
                "/tenants/{tenant}/restore",
                self.action(self.lifecycle(RESTORE_JOB_TYPE)),
                methods=["POST"],
            ),
            Route("/rollouts/resume", self.action(self.resume), methods=["POST"]),
            Route("/rollouts/{rollout_id}/pause", self.action(self.pause), methods=["POST"]),
            Route("/rollouts/abort", self.action(self.abort), methods=["POST"]),
            Mount("/static", StaticFiles(packages=[("provisioner.console", "static")])),
        ]
        return SecurityHeaders(Starlette(routes=routes))


def _rollout_id(request: Request) -> int:
    raw = request.path_params["rollout_id"]
    if not raw.isdigit() or not 0 < int(raw) < 2**63:
        raise InvalidInput(f"no rollout {raw!r}: a rollout id is a positive number")
    return int(raw)


async def _form(request: Request) -> dict[str, str]:
    """An url-encoded form body (the console's forms send nothing else), first value of each."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {key: values[0] for key, values in parse_qs(body).items()}


def create_app(settings: Settings) -> ASGIApp:
    return Console(settings).app()
