"""A Hugging Face Hub on 127.0.0.1 that serves a few repositories, for the tests of `attn.artifacts.hub`.

It answers the requests huggingface_hub makes to download a repository's files: the repository's information
(`GET /api/models/ORG/NAME/revision/REV`, whose "sha" is the commit), its tree (`GET /api/models/ORG/NAME/tree/REV`)
and each file (`HEAD` and `GET /ORG/NAME/resolve/REV/FILE`, with the `X-Repo-Commit`, `ETag` and `Content-Length`
headers the client checks). An unknown repository or file is a 404 with the Hub's `X-Error-Code`. Point
`HF_ENDPOINT` at `FakeHub.url` and `HF_HOME` at a new folder, and huggingface_hub lays out its own cache there.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from gguf import GGMLQuantizationType
from tiny_gguf import write_gguf

from attn import load_model
from attn.artifacts.pretrained import export_pretrained

GGUF_REPO, HF_REPO = "org/tiny-GGUF", "org/tiny-llama"


def tiny_repos(folder: Path) -> dict[str, dict[str, bytes]]:
    """Two repositories of one tiny random Llama, written into `folder` first.

    `GGUF_REPO` holds `tiny-Q4_K_M.gguf` and `tiny-Q8_0.gguf`, named as llama.cpp's quantizer names its files (the
    first holds Q4_0 blocks: the model is too narrow for K-quants' blocks of 256), and a README. `HF_REPO` holds the
    model as `attn convert` exports it (`folder/hf`: config.json, model.safetensors, tokenizer files), a README and a
    `pytorch_model.bin` that a loader of the safetensors must not fetch.
    """
    write_gguf(folder / "tiny-Q4_K_M.gguf", quant=GGMLQuantizationType.Q4_0)
    write_gguf(folder / "tiny-Q8_0.gguf", quant=GGMLQuantizationType.Q8_0)
    write_gguf(folder / "tiny-F32.gguf")
    bundle = load_model(folder / "tiny-F32.gguf", "cpu")
    export_pretrained(bundle.model, bundle.model_config, folder / "hf", "llama", bundle.tokenizer,
                      chat_template=bundle.chat_template)
    readme = b"# a tiny random model\n"
    return {
        GGUF_REPO: {"README.md": readme, **{name: (folder / name).read_bytes()
                                            for name in ("tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf")}},
        HF_REPO: {"README.md": readme, "pytorch_model.bin": b"not a model",
                  **{f.name: f.read_bytes() for f in (folder / "hf").iterdir()}},
    }


class FakeHub:
    """Serves `repos` ({"ORG/NAME": {file name: bytes}}) until `close`; `requests` lists the paths it was asked."""

    def __init__(self, repos: Mapping[str, Mapping[str, bytes]]) -> None:
        self.repos = {repo: dict(files) for repo, files in repos.items()}
        self.requests: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def commit(self, repo: str) -> str:
        """The repository's one commit: a hash of its files."""
        digest = hashlib.sha1()
        for name, data in sorted(self.repos[repo].items()):
            digest.update(name.encode() + hashlib.sha1(data).digest())
        return digest.hexdigest()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def env(self, home: Path, offline: bool = False) -> dict[str, str]:
        """The environment of a process that uses this Hub, with huggingface_hub's cache in `home`; offline, the
        `HF_HUB_OFFLINE=1` it is told."""
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("HF_", "HUGGINGFACE_")) and key != "TRANSFORMERS_OFFLINE"}
        env.update(HF_ENDPOINT=self.url, HF_HOME=str(home), HF_HUB_DISABLE_UPDATE_CHECK="1",
                   HF_HUB_DISABLE_TELEMETRY="1")
        if offline:
            env["HF_HUB_OFFLINE"] = "1"
        return env


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append(f"{self.command} {path}")
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                repo = "/".join(parts[2:4])
                if repo not in hub.repos:
                    return self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                files = hub.repos[repo]
                if parts[4] == "revision":
                    info = {"id": repo, "modelId": repo, "sha": hub.commit(repo), "private": False,
                            "siblings": [{"rfilename": name} for name in files]}
                else:
                    info = [{"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                            for name, data in sorted(files.items())]
                return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
            if len(parts) >= 5 and parts[2] == "resolve":
                repo, name = "/".join(parts[:2]), "/".join(parts[4:])
                if repo not in hub.repos:
                    return self._send(404, b"", {"X-Error-Code": "RepoNotFound"}, body)
                commit = {"X-Repo-Commit": hub.commit(repo)}
                if name not in hub.repos[repo]:
                    return self._send(404, b"", {**commit, "X-Error-Code": "EntryNotFound"}, body)
                data = hub.repos[repo][name]
                return self._send(200, data, {**commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}, body)
            self._send(404, b"", {}, body)

        def _send(self, status: int, data: bytes, headers: Mapping[str, str], body: bool = True) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler
