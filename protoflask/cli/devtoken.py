"""The development token file.

`serve --dev` saves its token (and URL) here so `protoflask chat` in another terminal
needs no copy-paste. It lives in the user's cache directory, mode 0600, and is removed
when that server stops. PROTOFLASK_DEV_TOKEN_FILE moves it (tests).
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


def save_dev_token(url: str, token: str) -> Path | None:
    path = dev_token_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"url": url, "token": token}, fh)
    except OSError:
        return None
    return path


def forget_dev_token(token: str) -> None:
    path = dev_token_file()
    try:
        if json.loads(path.read_text()).get("token") == token:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def dev_url() -> str | None:
    """The URL of the server whose `serve --dev` token is saved (the client commands'
    default when neither --url nor PROTOFLASK_URL is given)."""
    try:
        saved = json.loads(dev_token_file().read_text())
    except (OSError, ValueError):
        return None
    url = saved.get("url") if isinstance(saved, dict) else None
    return url if isinstance(url, str) and url else None


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
    try:
        saved = json.loads(dev_token_file().read_text())
    except (OSError, ValueError):
        return None
    if isinstance(saved, dict) and same_server(str(saved.get("url", "")), url):
        token = saved.get("token")
        return token if isinstance(token, str) else None
    return None
