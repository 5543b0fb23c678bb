"""Secret scrubbing: the one function every log line, ``error_detail`` and shown exception passes.

A leaf module (it imports nothing of the package), so the database adapter, the queue and the
logs can all redact without importing the settings.
"""

from __future__ import annotations

import re

# Greedy up to the last "@" of the run: a password holding an unencoded "@" is hidden whole.
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^\s]*(?P<tail>@)", re.I)
# A value is quoted the libpq way ('...' with backslash escapes, which may hold spaces, quotes
# and '='), double-quoted, or bare up to the next separator.
_KEY_VALUE_SECRET = re.compile(
    r"(?P<key>AccountKey|SharedAccessSignature|sig|password|secret|token|aws_secret_access_key)"
    r"(?P<sep>\s*[=:]\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^;&\s'\"]+)",
    re.I,
)


def redact(text: str) -> str:
    """Remove passwords in URLs (one host or a host list) and key=value secrets (libpq
    key=value strings, quoted or not; connection strings, SAS tokens)."""
    text = _URL_PASSWORD.sub(r"\g<head>***\g<tail>", text)
    return _KEY_VALUE_SECRET.sub(r"\g<key>\g<sep>***", text)
