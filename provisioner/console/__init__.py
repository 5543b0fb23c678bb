"""The operator's web console: ``provisioner console`` (the ``[console]`` extra).

A small ASGI app (Starlette) whose pages are rendered on the server from Jinja templates and
kept live by a few lines of plain JavaScript (:mod:`provisioner.console.app`): the fleet at a
glance, the rollouts, one tenant's history, the queue, the warm pool. It reads through the
library (:mod:`provisioner.console.pages`) and writes nothing unless the operator set
``PROVISIONER_CONSOLE_TOKEN`` and logged in with it (:mod:`provisioner.console.guard`); every
run an action starts records ``console`` as what started it. It listens on 127.0.0.1 unless
told otherwise.

    app.py     the routes, rendering, the actions, the security headers
    pages.py   what each page reads
    guard.py   the token, the session cookie, the CSRF tokens, the Origin check
"""

from __future__ import annotations

import uvicorn

from provisioner.console.app import create_app
from provisioner.settings import Settings

__all__ = ["create_app", "serve"]


def serve(settings: Settings, host: str, port: int) -> None:
    """Serve the console until interrupted (uvicorn's own signal handling stops it)."""
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info")
