"""Secret scrubbing: the one function every log line, ``error_detail`` and shown exception passes.

A leaf module (it imports nothing of the package), so the database adapter, the queue and the
logs can all redact without importing the settings.

**Most texts hold nothing to scrub, and are told so without the expressions**
(:func:`_may_hold_secret`): an ASCII text with no ``://`` and none of the keys' lower-case
words is returned as it is. Invariant: it skips only texts neither expression can change (each
needs ``://`` or one of the words; a non-ASCII text, which case-insensitive matching may fold
onto them, always takes the expressions), pinned by
``tests/unit/test_models.py::test_redact_skips_only_texts_its_expressions_leave_alone``. A
worker's parent scrubs every log line (8 a provisioned tenant) and its children every step's
detail: the two expressions cost 90 us on a 200-character log line, the check 4 us.
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


#: A lower-case word of each key of :data:`_KEY_VALUE_SECRET` ("sig" in SharedAccessSignature,
#: "secret" in aws_secret_access_key): a text without any of them holds no such key.
_KEY_WORDS = ("sig", "password", "secret", "token", "accountkey")


def _may_hold_secret(text: str) -> bool:
    """False only when neither expression can match: an ASCII text (exact lower-casing) with no
    ``://`` (every URL password's) and none of :data:`_KEY_WORDS`."""
    if not text.isascii() or "://" in text:
        return True
    lowered = text.lower()
    return any(word in lowered for word in _KEY_WORDS)


def redact(text: str) -> str:
    """Remove passwords in URLs (one host or a host list) and key=value secrets (libpq
    key=value strings, quoted or not; connection strings, SAS tokens)."""
    if not _may_hold_secret(text):
        return text
    text = _URL_PASSWORD.sub(r"\g<head>***\g<tail>", text)
    return _KEY_VALUE_SECRET.sub(r"\g<key>\g<sep>***", text)
