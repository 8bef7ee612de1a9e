"""The workspace a coding tool call may touch, and nothing outside it.

Every path a call names is resolved (``..`` removed, every symlink followed,
as the kernel would) before it is used; a path whose resolved form is not the
workspace or below it is refused, so a symlink inside the workspace that
points at ``/etc`` is refused as ``/etc`` itself would be.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ToolError", "Workspace"]


class ToolError(Exception):
    """A call that cannot be carried out; its message is the call's result,
    fed back to the model (``tool_end`` with ``ok: false``)."""


class Workspace:
    """The folder the coding tools work in (``--web-tools WORKSPACE_DIR``).

    Args:
        root (str | Path): the folder; resolved once, here.

    Raises:
        ValueError: ``root`` is not an existing folder.
    """

    def __init__(self, root: str | Path) -> None:
        resolved = Path(root).expanduser().resolve()
        if not resolved.is_dir():
            raise ValueError(f"--web-tools: {root!s} is not a folder")
        self.root = resolved

    def path(self, given: object, *, exists: bool = True) -> Path:
        """The resolved path of ``given`` (relative to the workspace, or absolute).

        Args:
            given (str): the call's path argument.
            exists (bool): it must exist already. Default: ``True``.

        Returns:
            Path: the resolved path, inside the workspace.

        Raises:
            ToolError: not a string, outside the workspace once resolved (a
                symlink out included), or missing while ``exists``.
        """
        if not isinstance(given, str) or not given or "\x00" in given:
            raise ToolError("path must be a non-empty string")
        candidate = Path(given).expanduser()
        if not candidate.is_absolute():
            candidate = self.root / candidate
        resolved = candidate.resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise ToolError(f"{given!r} is outside the workspace")
        if exists and not resolved.exists():
            raise ToolError(f"{given!r} does not exist")
        return resolved

    def show(self, path: Path) -> str:
        """``path`` as the model sees it: relative to the workspace."""
        return "." if path == self.root else str(path.relative_to(self.root))
