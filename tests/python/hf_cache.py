"""Reads or fills the HF cache with the official huggingface_hub client, for tests/hf_interop.rs.

usage:
  hf_cache.py read REPO COMMIT         -> JSON: what huggingface_hub sees of REPO@COMMIT in the cache
  hf_cache.py fetch REPO FILE [FILE…]  -> downloads FILEs from HF_ENDPOINT with hf_hub_download

The cache root comes from HF_HUB_CACHE, exactly as inferno reads it.
"""

import hashlib
import json
import sys
from pathlib import Path

from huggingface_hub import hf_hub_download, scan_cache_dir, snapshot_download


def read(repo: str, commit: str) -> dict:
    info = scan_cache_dir()
    matches = [r for r in info.repos if r.repo_id == repo and r.repo_type == "model"]
    if not matches:
        return {"found": False, "warnings": [str(w) for w in info.warnings]}
    repo_info = matches[0]
    revs = [r for r in repo_info.revisions if r.commit_hash == commit]
    rev = revs[0]
    files = {}
    for f in rev.files:
        rel = str(f.file_path.relative_to(rev.snapshot_path))
        # Through the public download API, cache-only: must resolve to the same content.
        path = hf_hub_download(repo, rel, revision="main", local_files_only=True)
        files[rel] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    snap = snapshot_download(repo, local_files_only=True)
    return {
        "found": True,
        "refs": sorted(rev.refs),
        "files": files,
        "size_on_disk": repo_info.size_on_disk,
        "snapshot": str(Path(snap).resolve()),
        "warnings": [str(w) for w in info.warnings],
    }


def fetch(repo: str, files: list) -> dict:
    return {f: hf_hub_download(repo, f) for f in files}


if __name__ == "__main__":
    cmd, repo = sys.argv[1], sys.argv[2]
    out = read(repo, sys.argv[3]) if cmd == "read" else fetch(repo, sys.argv[3:])
    print(json.dumps(out))
