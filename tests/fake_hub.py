"""A local stand-in for the Hugging Face hub, for the library's download tests.

A small Starlette app serving what ``huggingface_hub`` calls: repo info
(``/api/models/{repo}/revision/{rev}``), the file tree
(``/api/models/{repo}/tree/{rev}``), file resolve (``HEAD``/``GET
/{repo}/resolve/{rev}/{path}``, with ``X-Repo-Commit``, ``ETag``, sizes and
``Range``) and search (``/api/models?search=&filter=``). Point ``HF_ENDPOINT`` at
it. Knobs: ``delay`` (seconds per 16 KiB chunk of a weight file, so progress can
be watched), ``cut`` (file names whose first ``GET`` breaks off half way).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

CHUNK = 16 * 1024


@dataclass
class FakeRepo:
    """One model repo: its commit, files and tags."""

    commit: str
    files: dict[str, bytes]
    tags: tuple[str, ...] = ("mlx",)
    downloads: int = 0


@dataclass
class FakeHub:
    """The hub's state and what it saw."""

    repos: dict[str, FakeRepo] = field(default_factory=dict)
    delay: float = 0.0
    cut: set[str] = field(default_factory=set)
    ranges: list[str] = field(default_factory=list)
    gets: list[str] = field(default_factory=list)

    def add(self, repo_id: str, files: dict[str, bytes], tags: tuple[str, ...] = ("mlx",)) -> str:
        """Publish ``files`` as ``repo_id``; returns its commit hash."""
        commit = hashlib.sha1(repo_id.encode() + b"".join(sorted(files.values()))).hexdigest()
        self.repos[repo_id] = FakeRepo(commit, dict(files), tags)
        return commit

    def app(self) -> Starlette:
        """The ASGI app."""
        return Starlette(
            routes=[
                Route("/health", self.health),
                Route("/api/models", self.search),
                Route("/api/models/{org}/{name}/revision/{rev}", self.info),
                Route("/api/models/{org}/{name}/tree/{rev:path}", self.tree),
                Route(
                    "/{org}/{name}/resolve/{rev}/{path:path}", self.resolve, methods=["GET", "HEAD"]
                ),
            ]
        )

    def _repo(self, request: Request) -> FakeRepo | None:
        return self.repos.get(f"{request.path_params['org']}/{request.path_params['name']}")

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def search(self, request: Request) -> Response:
        q = request.query_params.get("search", "")
        wanted = set(request.query_params.getlist("filter"))
        rows = [
            {"id": rid, "modelId": rid, "downloads": r.downloads, "likes": 1, "tags": list(r.tags)}
            for rid, r in self.repos.items()
            if q.lower() in rid.lower() and wanted <= set(r.tags)
        ]
        return JSONResponse(rows)

    async def info(self, request: Request) -> Response:
        repo = self._repo(request)
        if repo is None:
            return JSONResponse(
                {"error": "Repository not found"}, 404, {"X-Error-Code": "RepoNotFound"}
            )
        rid = f"{request.path_params['org']}/{request.path_params['name']}"
        return JSONResponse(
            {
                "id": rid,
                "modelId": rid,
                "sha": repo.commit,
                "private": False,
                "tags": list(repo.tags),
                "siblings": [{"rfilename": name} for name in repo.files],
            }
        )

    async def tree(self, request: Request) -> Response:
        repo = self._repo(request)
        if repo is None:
            return JSONResponse(
                {"error": "Repository not found"}, 404, {"X-Error-Code": "RepoNotFound"}
            )
        rows = []
        for name, content in repo.files.items():
            row = {
                "type": "file",
                "path": name,
                "size": len(content),
                "oid": hashlib.sha1(content).hexdigest(),
            }
            if name.endswith(".safetensors"):
                sha = hashlib.sha256(content).hexdigest()
                row["lfs"] = {"oid": sha, "size": len(content), "pointerSize": 130}
            rows.append(row)
        return JSONResponse(rows)

    async def resolve(self, request: Request) -> Response:
        repo = self._repo(request)
        name = request.path_params["path"]
        if repo is None or name not in repo.files:
            return JSONResponse(
                {"error": "Entry not found"}, 404, {"X-Error-Code": "EntryNotFound"}
            )
        content = repo.files[name]
        headers = {
            "X-Repo-Commit": repo.commit,
            "ETag": f'"{hashlib.sha256(content).hexdigest()}"',
            "Accept-Ranges": "bytes",
        }
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(content))
            return Response(b"", 200, headers)
        start = 0
        if rng := request.headers.get("range"):
            self.ranges.append(f"{name} {rng}")
            start = int(rng.removeprefix("bytes=").split("-")[0] or 0)
        self.gets.append(name)
        body = content[start:]
        cut = name in self.cut
        self.cut.discard(name)
        headers["Content-Length"] = str(len(body))
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
        return StreamingResponse(self._stream(body, cut, name), status, headers)

    async def _stream(self, body: bytes, cut: bool, name: str) -> AsyncIterator[bytes]:
        limit = len(body) // 2 if cut else len(body)
        for at in range(0, limit, CHUNK):
            if self.delay and name.endswith(".safetensors"):
                await asyncio.sleep(self.delay)
            yield body[at : min(at + CHUNK, limit)]
        if cut:
            raise ConnectionResetError("fake hub: connection cut half way")
