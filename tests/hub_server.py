"""A local HTTP server that speaks the few Hugging Face Hub endpoints ``huggingface_hub`` uses to create a repo,
upload files and read them back. It is a test double of the Hub, not of our code: tests point
``HfApi(endpoint=...)`` / ``HF_ENDPOINT`` at it and run the real client.

Endpoints (as called by huggingface_hub 1.x/2.x):

- ``GET  /api/whoami-v2``                                   who owns the token
- ``POST /api/repos/create``                                create a repo (409 if it exists)
- ``GET  /api/{models|datasets}/{repo}``                    repo info
- ``POST /api/validate-yaml``                               the README.md front matter must be valid YAML
- ``POST /api/{type}s/{repo}/preupload/{rev}``              regular (inline) or LFS upload per file
- ``POST /{[datasets/]}{repo}.git/info/lfs/objects/batch``   LFS "basic" transfer: upload + verify actions
- ``PUT  /_lfs/{oid}`` and ``POST /_lfs/{oid}/verify``       the LFS object store (sha256 checked)
- ``POST /api/{type}s/{repo}/commit/{rev}``                 ndjson commit (header, file, lfsFile)
- ``GET  /api/{type}s/{repo}/tree/{rev}``                   file listing
- ``GET  /api/{type}s/{repo}/revision/{rev}``               repo info at a revision
- ``HEAD|GET /{[datasets/]}{repo}/resolve/{rev}/{path}``    file download

``{rev}`` is ``main`` or the oid of any commit: reads see the files as that commit left them.

The Xet transfer protocol is not spoken: run the client with ``HF_HUB_DISABLE_XET=1`` (or patch
``huggingface_hub.constants.HF_HUB_DISABLE_XET``) so that large files take the LFS route.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import yaml

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".png", ".gguf", ".npy")
LFS_MIN_SIZE = 10 * 2**20  # the Hub also sends big files to LFS


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[dict] = field(default_factory=list)
    snapshots: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit oid -> the files it left

    @property
    def sha(self) -> str:
        return self.commits[-1]["oid"] if self.commits else "0" * 40

    def at(self, rev: str | None) -> tuple[str, dict[str, bytes]] | None:
        """(oid, files) at ``rev`` (``main``, None or a commit oid), or None for an unknown revision."""
        if rev in (None, "main", self.sha):
            return self.sha, self.files
        return (rev, self.snapshots[rev]) if rev in self.snapshots else None


class HubState:
    def __init__(self, tokens: dict[str, str]):
        self.tokens = dict(tokens)  # token -> user name
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeHub/1.0"
    protocol_version = "HTTP/1.1"

    # ------------------------------------------------------------------ plumbing
    @property
    def state(self) -> HubState:
        return self.server.state  # type: ignore[attr-defined]

    @property
    def base(self) -> str:
        host, port = self.server.server_address[:2]  # type: ignore[attr-defined]
        return f"http://{host}:{port}"

    def log_message(self, *args):  # keep test output clean
        pass

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            return self.rfile.read(n)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        return b""

    def _send(self, status: int, payload=None, headers: dict | None = None, raw: bytes | None = None, head=False):
        body = raw if raw is not None else (json.dumps(payload).encode() if payload is not None else b"")
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream" if raw is not None else "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, message: str, code: str | None = None, head=False):
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, {"error": message}, headers, head=head)

    def _user(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        token = auth[7:] if auth.lower().startswith("bearer ") else None
        return self.state.tokens.get(token) if token else None

    def _repo(self, repo_type: str, repo_id: str) -> Repo | None:
        return self.state.repos.get((repo_type, repo_id))

    def _can_write(self, repo: Repo) -> bool:
        user = self._user()
        return user is not None and repo.repo_id.split("/")[0] == user

    def _can_read(self, repo: Repo) -> bool:
        return not repo.private or self._can_write(repo)

    # ------------------------------------------------------------------ dispatch
    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    ROUTES = [
        ("GET", r"/api/whoami-v2", "whoami"),
        ("POST", r"/api/repos/create", "create_repo"),
        ("POST", r"/api/validate-yaml", "validate_yaml"),
        ("POST", r"/api/(?P<type>model|dataset)s/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/]+)", "preupload"),
        ("POST", r"/api/(?P<type>model|dataset)s/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/]+)", "commit"),
        ("GET", r"/api/(?P<type>model|dataset)s/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?P<path>/.*)?", "tree"),
        ("GET", r"/api/(?P<type>model|dataset)s/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?", "repo_info"),
        ("POST", r"/(?P<prefix>datasets/)?(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch", "lfs_batch"),
        ("PUT", r"/_lfs/(?P<oid>[0-9a-f]{64})", "lfs_put"),
        ("POST", r"/_lfs/(?P<oid>[0-9a-f]{64})/verify", "lfs_verify"),
        ("GET", r"/(?P<prefix>datasets/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
        ("HEAD", r"/(?P<prefix>datasets/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
    ]

    def _dispatch(self, method: str):
        path = unquote(urlsplit(self.path).path)
        with self.state.lock:
            self.state.requests.append((method, path))
        for m, pattern, name in self.ROUTES:
            if m == method and (match := re.fullmatch(pattern, path)):
                try:
                    return getattr(self, "h_" + name)(**match.groupdict())
                except Exception as e:  # a bug in the double must show up in the test, not hang it
                    return self._error(500, f"fake hub error: {type(e).__name__}: {e}")
        self._error(404, f"no route for {method} {path}", head=method == "HEAD")

    # ------------------------------------------------------------------ handlers
    def h_whoami(self):
        user = self._user()
        if user is None:
            return self._error(401, "Invalid credentials in Authorization header")
        self._send(200, {"type": "user", "name": user, "orgs": [], "auth": {"accessToken": {"role": "write"}}})

    def h_create_repo(self):
        user = self._user()
        if user is None:
            return self._error(401, "Invalid credentials in Authorization header")
        body = json.loads(self._body() or b"{}")
        namespace = body.get("organization") or user
        if namespace != user:
            return self._error(403, f"You don't have the rights to create a repo under the namespace {namespace}")
        repo_type = body.get("type") or "model"
        repo_id = f"{namespace}/{body['name']}"
        url = f"{self.base}/{'datasets/' if repo_type == 'dataset' else ''}{repo_id}"
        private = body.get("private", body.get("visibility") == "private")
        with self.state.lock:
            if (repo_type, repo_id) in self.state.repos:  # the Hub's 409 body still carries the url
                message = f"You already created this {repo_type} repo"
                return self._send(409, {"error": message, "url": url}, {"X-Error-Message": message})
            self.state.repos[(repo_type, repo_id)] = Repo(repo_id, repo_type, bool(private))
        self._send(200, {"url": url, "name": repo_id})

    def h_validate_yaml(self):
        body = json.loads(self._body() or b"{}")
        content = body.get("content", "")
        m = re.match(r"^---\s*\n(.*?)\n---\s*\n", content, re.S)
        if m is None:
            return self._send(200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata in repo card"}]})
        try:
            meta = yaml.safe_load(m.group(1))
        except yaml.YAMLError as e:
            return self._send(400, {"errors": [{"message": f"YAML: {e}"}], "warnings": []})
        if not isinstance(meta, dict):
            return self._send(400, {"errors": [{"message": "metadata must be a mapping"}], "warnings": []})
        return self._send(200, {"errors": [], "warnings": []})

    def _writable(self, type: str, repo: str) -> Repo | None:
        r = self._repo(type, repo)
        if r is None or not self._can_read(r):
            self._error(404, "Repository Not Found", "RepoNotFound")
            return None
        if not self._can_write(r):
            self._error(403, "You don't have the rights to write to this repo")
            return None
        return r

    def h_preupload(self, type: str, repo: str, rev: str):
        r = self._writable(type, repo)
        if r is None:
            return
        files = json.loads(self._body())["files"]
        out = []
        for f in files:
            lfs = f["path"].endswith(LFS_SUFFIXES) or f["size"] >= LFS_MIN_SIZE
            out.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False})
        self._send(200, {"files": out, "commitOid": r.sha})

    def h_lfs_batch(self, repo: str, prefix: str | None = None):
        r = self._writable("dataset" if prefix else "model", repo)
        if r is None:
            return
        body = json.loads(self._body())
        objects = []
        for obj in body["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.state.lfs:
                entry["actions"] = {
                    "upload": {"href": f"{self.base}/_lfs/{obj['oid']}", "header": {}},
                    "verify": {"href": f"{self.base}/_lfs/{obj['oid']}/verify", "header": {}},
                }
            objects.append(entry)
        self._send(200, {"transfer": "basic", "objects": objects})

    def h_lfs_put(self, oid: str):
        data = self._body()
        if hashlib.sha256(data).hexdigest() != oid:
            return self._error(400, "sha256 of the uploaded content does not match the object id")
        with self.state.lock:
            self.state.lfs[oid] = data
        self._send(200, {})

    def h_lfs_verify(self, oid: str):
        body = json.loads(self._body() or b"{}")
        data = self.state.lfs.get(oid)
        if data is None or len(data) != body.get("size"):
            return self._error(404, "LFS object not found or of the wrong size")
        self._send(200, {})

    def h_commit(self, type: str, repo: str, rev: str):
        r = self._writable(type, repo)
        if r is None:
            return
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        header = next((x["value"] for x in lines if x["key"] == "header"), None)
        if header is None or not header.get("summary"):
            return self._error(400, "commit header with a summary is required")
        new_files = {}
        for item in lines:
            key, value = item["key"], item["value"]
            if key == "file":
                new_files[value["path"]] = base64.b64decode(value["content"])
            elif key == "lfsFile":
                data = self.state.lfs.get(value["oid"])
                if data is None or len(data) != value["size"]:
                    return self._error(400, f"LFS object of {value['path']} was not uploaded")
                new_files[value["path"]] = data
            elif key in ("deletedFile", "deletedFolder"):
                new_files[value["path"]] = None
        oid = hashlib.sha1(json.dumps([r.sha, header, sorted(new_files)]).encode()).hexdigest()
        with self.state.lock:
            for path, data in new_files.items():
                if data is None:
                    r.files = {p: d for p, d in r.files.items() if p != path and not p.startswith(path.rstrip("/") + "/")}
                else:
                    r.files[path] = data
            r.commits.append({"oid": oid, "summary": header["summary"], "files": sorted(new_files)})
            r.snapshots[oid] = dict(r.files)
        prefix = "datasets/" if type == "dataset" else ""
        self._send(200, {"commitUrl": f"{self.base}/{prefix}{repo}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None})

    def h_tree(self, type: str, repo: str, rev: str, path: str | None = None):
        r = self._repo(type, repo)
        if r is None or not self._can_read(r):
            return self._error(404, "Repository Not Found", "RepoNotFound")
        if (found := r.at(rev)) is None:
            return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        sub = (path or "").strip("/")
        entries = [
            {"type": "file", "path": p, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
            for p, d in sorted(found[1].items())
            if not sub or p.startswith(sub + "/")
        ]
        self._send(200, entries)

    def h_repo_info(self, type: str, repo: str, rev: str | None = None):
        r = self._repo(type, repo)
        if r is None or not self._can_read(r):
            return self._error(404, "Repository Not Found", "RepoNotFound")
        if (found := r.at(rev)) is None:
            return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        oid, files = found
        self._send(200, {"id": repo, "sha": oid, "private": r.private, "siblings": [{"rfilename": p} for p in sorted(files)]})

    def h_resolve(self, repo: str, rev: str, path: str, prefix: str | None = None):
        head = self.command == "HEAD"
        r = self._repo("dataset" if prefix else "model", repo)
        if r is None or not self._can_read(r):
            return self._error(404, "Repository Not Found", "RepoNotFound", head=head)
        if (found := r.at(rev)) is None:
            return self._error(404, f"Invalid rev id: {rev}", "RevisionNotFound", head=head)
        oid, files = found
        data = files.get(path)
        if data is None:
            return self._error(404, "Entry not found", "EntryNotFound", head=head)
        etag = '"' + hashlib.sha256(data).hexdigest() + '"'
        self._send(200, raw=data, headers={"X-Repo-Commit": oid, "ETag": etag}, head=head)


class FakeHub:
    """``with FakeHub({"hf_token": "alice"}) as hub: HfApi(endpoint=hub.url, token="hf_token")...``"""

    def __init__(self, tokens: dict[str, str] | None = None):
        self.state = HubState(tokens or {})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.state = self.state  # type: ignore[attr-defined]
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo | None:
        return self.state.repos.get((repo_type, repo_id))

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
