"""The durable "always allow" list of gated tools (reference, "Settings":
``GET/DELETE /api/settings/tool-approvals``).

Keyed by the tool's name, never by a call's arguments. The list is a JSON file,
``tool-approvals.json`` in mlxspec's config folder (``MLXSPEC_CONFIG_DIR``, else
``$XDG_CONFIG_HOME/mlxspec``, else ``~/.config/mlxspec``), written whole through
a temporary file and a rename, mode 0600 (its folder 0700). A tool joins it only
through an approval card (``approval`` with ``alwaysAllow: true``); the settings
routes read and forget.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path

__all__ = ["ApprovalList", "config_dir"]

_LOCK = threading.Lock()


def config_dir() -> Path:
    """mlxspec's config folder (``MLXSPEC_CONFIG_DIR``, else the XDG one)."""
    configured = os.environ.get("MLXSPEC_CONFIG_DIR")
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".config") / "mlxspec"


class ApprovalList:
    """The always-allow file.

    Args:
        path (Path | None): the file. Default: ``None`` (``tool-approvals.json``
            in :func:`config_dir`, read when used, so a test's environment counts).
    """

    def __init__(self, path: Path | None = None) -> None:
        self._path = path

    @property
    def path(self) -> Path:
        """The file."""
        return self._path or config_dir() / "tool-approvals.json"

    def tools(self) -> list[str]:
        """The always-allowed tool names, sorted; a missing or unreadable file is none."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        names = data.get("alwaysAllow") if isinstance(data, dict) else None
        return sorted({n for n in names if isinstance(n, str)}) if isinstance(names, list) else []

    def add(self, tool: str) -> list[str]:
        """Always allow ``tool``; returns the new list."""
        with _LOCK:
            return self._save(sorted({*self.tools(), tool}))

    def remove(self, tool: str) -> list[str]:
        """Forget ``tool`` (a tool not listed is no error); returns the new list."""
        with _LOCK:
            names = [n for n in self.tools() if n != tool]
            return self._save(names) if self.path.exists() else names

    def _save(self, names: list[str]) -> list[str]:
        folder = self.path.parent
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tool-approvals.")  # created 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"alwaysAllow": names}, f)
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return names
