"""The browser runtime, set up by the project: Chromium, Playwright's browser folder, MiniWoB.

Playwright cannot download its own browser here, so the project points it at Debian's
Chromium: ``PLAYWRIGHT_BROWSERS_PATH`` becomes a folder under the project's cache whose
``chromium-<revision>/chrome-linux/chrome`` is a link to the system binary (every launch
then finds it, BrowserGym's own included). MiniWoB's task pages come from the installed
``miniwob`` package as ``file://`` URLs, with no server. Anything missing is a
``RuntimeError`` naming it and the command that installs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

from agentic_esopt import fileio

INSTALL_WEB = 'pip install -e ".[web]"'
INSTALL_CHROMIUM = "apt-get install -y chromium"
# Debian's real binary first (/usr/bin/chromium is a wrapper script), then PATH.
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser")
# Headless Chromium for unattended runs: nothing phones home, nothing updates itself.
CHROMIUM_FLAGS = ("--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic", "--disable-gpu")


def package_dir(module: str) -> Path | None:
    """The folder of an installed package, found without importing it (None if absent)."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # its parent package is missing
        return None
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def require_package(module: str, distribution: str, install: str = INSTALL_WEB) -> Path:
    """``package_dir(module)``, or a RuntimeError naming ``distribution`` and ``install``."""
    folder = package_dir(module)
    if folder is None:
        raise RuntimeError(f"this environment needs the Python package {distribution!r} "
                           f"(module {module!r} is not installed); install it with: {install}")
    return folder


def chromium_binary() -> str:
    """The path of the system's Chromium, or a RuntimeError that says how to install it."""
    for candidate in CHROMIUM_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return os.path.realpath(found)
    raise RuntimeError(f"the web environments need Chromium (none of {CHROMIUM_CANDIDATES} "
                       f"was found); install it with: {INSTALL_CHROMIUM}")


def chromium_flags() -> list[str]:
    """Launch flags; as root Chromium also needs ``--no-sandbox``."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    return [*CHROMIUM_FLAGS, *(("--no-sandbox",) if root else ())]


def playwright_chromium_revision() -> str:
    """The Chromium revision the installed Playwright looks for (its ``browsers.json``)."""
    package = require_package("playwright", "playwright")
    manifest = json.loads((package / "driver" / "package" / "browsers.json").read_text())
    return next(b["revision"] for b in manifest["browsers"] if b["name"] == "chromium")


def browsers_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """A ``PLAYWRIGHT_BROWSERS_PATH`` folder whose Chromium is the system's (made once).

    The link is (re)made when missing or pointing elsewhere; the update is atomic
    (``os.replace`` of a fresh link), so concurrent callers never see a half-made folder.
    """
    binary = chromium_binary()
    root = fileio.cache_root(cache_dir) / "playwright-browsers"
    chrome_dir = root / f"chromium-{playwright_chromium_revision()}" / "chrome-linux"
    link = chrome_dir / "chrome"
    if not (link.is_symlink() and os.readlink(link) == binary):
        chrome_dir.mkdir(parents=True, exist_ok=True)
        temporary = chrome_dir / f".chrome-{os.getpid()}"
        if temporary.is_symlink():
            temporary.unlink()
        temporary.symlink_to(binary)
        os.replace(temporary, link)
    # Playwright treats a browser folder as installed once its marker file exists.
    (chrome_dir.parent / "INSTALLATION_COMPLETE").touch()
    return root


def miniwob_url() -> str:
    """``file://`` URL of the installed ``miniwob`` package's task pages (ends in '/')."""
    pages = require_package("miniwob", "miniwob") / "html" / "miniwob"
    if not pages.is_dir():
        raise RuntimeError(f"the installed miniwob package has no task pages at {pages}; "
                           f"reinstall it with: {INSTALL_WEB}")
    return pages.as_uri() + "/"


def worker_environment(cache_dir: str | os.PathLike | None = None,
                       miniwob: bool = True) -> dict[str, str]:
    """The environment variables of a browser worker process (checks every piece first)."""
    require_package("browsergym.core", "browsergym-core")
    env = dict(os.environ)
    env["PLAYWRIGHT_BROWSERS_PATH"] = str(browsers_path(cache_dir))
    if miniwob:
        require_package("browsergym.miniwob", "browsergym-miniwob")
        env["MINIWOB_URL"] = miniwob_url()
    return env
