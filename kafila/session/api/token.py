"""The chat API's bearer token: a fresh one per serving process, in a file only this user can read.

127.0.0.1 is not a trust boundary (DESIGN §5): every local user can connect to the API. The token
file, `<user runtime dir>/kafila/api-<port>.token` (mode 0600 in a 0700 directory), is what tells
the user's own clients (`kafila chat`, the TUI, any OpenAI client given it as `api_key`) from
everyone else's. `KAFILA_API_TOKEN` hands a client the token directly.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import os
import secrets
import stat
import warnings
from pathlib import Path
from urllib.parse import urlsplit

from kafila.errors import SessionError

TOKEN_ENV = "KAFILA_API_TOKEN"


def token_dir() -> Path:
    """Where token files live: the user's runtime directory (tmpfs, private, cleared at reboot)."""
    import platformdirs

    with warnings.catch_warnings():  # its fallback when XDG_RUNTIME_DIR is unset is fine: it checks owner and mode
        warnings.simplefilter("ignore")
        try:
            return Path(platformdirs.user_runtime_dir("kafila"))
        except OSError as exc:  # the fallback in /tmp made by another user first, or a link: not ours to use
            raise SessionError(f"there is no private runtime directory for the chat API's token ({exc}); set "
                               "XDG_RUNTIME_DIR to a directory only you can use (mode 0700)") from None


def token_path(port: int) -> Path:
    """The token file of the API serving on `port`."""
    return token_dir() / f"api-{port}.token"


# GET ?nonce=<32 hex>: the server shows it holds the token without sending it, for the address it is reached at
PROOF_PATH = "/kafila/proof"
NONCE_HEX = 32


def proof(token: str, client_nonce: bytes, server_nonce: bytes, address: str) -> str:
    """What a server holding `token` answers to `client_nonce` on a connection that reached it at `address`
    ("ip:port", `endpoint`), with a nonce of its own: HMAC-SHA256, hex. Bound to the address, so a program
    on another port that relays the client's nonce to the server gets a proof for the server's port, not its
    own; the server's nonce keeps the server from MACing only what a caller chose."""
    msg = b"kafila-api-proof\x01" + client_nonce + server_nonce + address.encode()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def endpoint(addr: object) -> str | None:
    """A socket's address ((ip, port, ...) as sockname and peername give it) as "ip:port" ("[ip]:port" for IPv6,
    an IPv4-mapped IPv6 address as IPv4), the same whichever end of the connection names it; None if not one."""
    if not isinstance(addr, tuple) or len(addr) < 2 or not isinstance(addr[0], str) or not isinstance(addr[1], int):
        return None
    try:
        ip = ipaddress.ip_address(addr[0].split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"[{ip}]:{addr[1]}" if ip.version == 6 else f"{ip}:{addr[1]}"


def new_token() -> str:
    """A fresh bearer token (256 bits)."""
    return secrets.token_urlsafe(32)


def write_token(port: int, token: str) -> Path:
    """Write the token of the API on `port` where only this user can read it; returns the file."""
    path = token_path(port)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(path.parent)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a file left by an earlier process on this port
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError as exc:
        raise SessionError(f"cannot write the chat API's token file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


def remove_token(path: Path, token: str) -> None:
    """Remove our token file (not one a later process on the same port wrote since)."""
    with contextlib.suppress(OSError):
        if path.read_text().strip() == token:
            path.unlink()


def read_token(url: str) -> str | None:
    """The token for the API at `url`: KAFILA_API_TOKEN, else the file of its port; None when neither exists."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    try:
        port = urlsplit(url).port
    except ValueError:
        return None
    if port is None:
        return None
    try:
        return token_path(port).read_text().strip() or None
    except OSError:
        return None


def own_session_url(default: str) -> str:
    """`default` when a session of this user serves there, else the newest one that serves elsewhere (its port
    was taken, so it moved to the next free one: its token file says where), else `default`."""
    try:
        port = urlsplit(default).port
        if port is not None and token_path(port).is_file():
            return default
        files = sorted(token_dir().glob("api-*.token"), key=lambda f: f.stat().st_mtime, reverse=True)
    except (OSError, ValueError, SessionError):
        return default
    ports = [f.stem.removeprefix("api-") for f in files]
    return next((f"http://127.0.0.1:{p}" for p in ports if p.isdigit()), default)


def _check_private(directory: Path) -> None:
    """Refuse a directory another user owns or can enter (they could read or swap the token)."""
    if not hasattr(os, "getuid"):
        return  # Windows: the per-user profile directory is private already
    st = directory.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise SessionError(f"{directory} is not a directory of this user; the API token cannot be kept there")
    if st.st_mode & 0o077:
        os.chmod(directory, 0o700)
