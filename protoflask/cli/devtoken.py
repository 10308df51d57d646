"""The development token file.

`serve --dev` saves its token (and URL) here so `protoflask chat` in another terminal
needs no copy-paste. It lives in the user's cache directory, mode 0600; each server
adds its own entry and removes only that one when it stops, so two servers (on two
ports) do not take each other's token away. PROTOFLASK_DEV_TOKEN_FILE moves it (tests).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .usage import DEFAULT_URL


def dev_token_file() -> Path:
    explicit = os.environ.get("PROTOFLASK_DEV_TOKEN_FILE")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "protoflask" / "dev-token.json"


def same_server(a: str, b: str) -> bool:
    def norm(url: str) -> str:
        url = url.rstrip("/")
        for local in ("localhost", "0.0.0.0", "[::1]"):
            url = url.replace(f"//{local}:", "//127.0.0.1:")
        return url
    return norm(a) == norm(b)


def _entries() -> list[dict[str, str]]:
    """The saved servers, oldest first: one {url, token} per running `serve --dev` (a
    file of one object, as older versions wrote it, is one entry)."""
    try:
        saved = json.loads(dev_token_file().read_text())
    except (OSError, ValueError):
        return []
    items = saved.get("servers", [saved]) if isinstance(saved, dict) else []
    return [e for e in items if isinstance(e, dict) and isinstance(e.get("url"), str)
            and isinstance(e.get("token"), str) and e["url"] and e["token"]]


def _write(entries: list[dict[str, str]]) -> None:
    """Replace the file at once (a temporary file renamed over it), mode 0600; no file
    when no server is left."""
    path = dev_token_file()
    if not entries:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"servers": entries}, fh)
    os.replace(temp, path)


def save_dev_token(url: str, token: str) -> Path | None:
    """Add this server's token (replacing an older one for the same URL): two `serve
    --dev` on different ports each keep theirs."""
    try:
        entries = [e for e in _entries() if not same_server(e["url"], url)]
        _write([*entries, {"url": url, "token": token}])
    except OSError:
        return None
    return dev_token_file()


def forget_dev_token(token: str) -> None:
    """Remove this server's token (only its own: another server's stays)."""
    try:
        _write([e for e in _entries() if e["token"] != token])
    except OSError:
        pass


def dev_url() -> str | None:
    """The URL of the newest server whose `serve --dev` token is saved (the client
    commands' default when neither --url nor PROTOFLASK_URL is given)."""
    entries = _entries()
    return entries[-1]["url"] if entries else None


def default_url() -> tuple[str, str]:
    """The client commands' URL when --url is not given, and where it came from."""
    if os.environ.get("PROTOFLASK_URL"):
        return os.environ["PROTOFLASK_URL"], "from PROTOFLASK_URL"
    dev = dev_url()
    if dev:
        return dev, (f"saved by `protoflask serve --dev` in {dev_token_file()}: is that "
                     "server still running?")
    return DEFAULT_URL, "the default; pass --url or set PROTOFLASK_URL"


def dev_token_for(url: str) -> str | None:
    for entry in reversed(_entries()):
        if same_server(entry["url"], url):
            return entry["token"]
    return None
