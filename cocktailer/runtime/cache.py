"""The on-disk cache: compiled libraries and the measured policy's measurements, by key.

Location: $COCKTAILER_CACHE_DIR, else $XDG_CACHE_HOME/cocktailer, else ~/.cache/cocktailer
(read at every use, so a test or a benchmark can point it elsewhere). Bound:
$COCKTAILER_CACHE_MB megabytes (default 1024); past it, the least recently used entries are
removed.

Every file is written under a temporary name and renamed into place, so a reader (another
process compiling the same program) sees the whole file or none. An entry's manifest
(`<name>.json`: size and sha256 of its file) is written last and checked before the file is
used: a library truncated or corrupted on disk (a full disk, a killed copy, a bad sector) is
rebuilt instead of loaded (loading a truncated library can crash the process).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from stat import S_ISREG

CACHE_VARIABLE = "COCKTAILER_CACHE_DIR"
BOUND_VARIABLE = "COCKTAILER_CACHE_MB"
DEFAULT_BOUND_MB = 1024
STALE_TEMP_SECONDS = 3600   # a temporary file this old belongs to a process that died mid-write

_valid: dict[Path, tuple[int, int]] = {}   # entries checked in this process: path -> (size, mtime_ns)


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cocktailer"
    path = Path(os.environ.get(CACHE_VARIABLE) or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def bound_bytes() -> int:
    return int(float(os.environ.get(BOUND_VARIABLE) or DEFAULT_BOUND_MB) * 2 ** 20)


def write_atomic(path: Path, data: bytes):
    """`path` holds `data` or what it held before, never a part of it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _unlink(Path(tmp))
        raise


def commit(path: Path):
    """Record `path` (already in place) as a valid entry: its manifest, written last."""
    data = path.read_bytes()
    manifest = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    write_atomic(_manifest(path), json.dumps(manifest).encode())
    _remember(path)


def valid(path: Path) -> bool:
    """Whether `path` is a whole entry: its manifest exists and its size and hash match. A
    hit marks the entry as recently used (eviction keeps it longest)."""
    try:
        stat = path.stat()
        if _valid.get(path) != (stat.st_size, stat.st_mtime_ns):
            manifest = json.loads(_manifest(path).read_text())
            if manifest["size"] != stat.st_size or manifest["sha256"] != hashlib.sha256(path.read_bytes()).hexdigest():
                return False
            _remember(path)
        os.utime(_manifest(path))
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def forget(path: Path):
    """Drop an entry (it failed to load): the next use rebuilds it."""
    _valid.pop(path, None)
    for p in (_manifest(path), path):
        _unlink(p)


def read_json(name: str) -> dict | None:
    """A small record (a measurement) by name; None if absent or unreadable. Written
    atomically, so a parse error means damage: the record is measured again."""
    try:
        return json.loads((cache_dir() / name).read_text())
    except (OSError, ValueError):
        return None


def write_json(name: str, value: dict):
    path = cache_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(value).encode())


def evict(bound: int | None = None):
    """Remove least recently used entries (by their manifest's time of last use) until the
    cache holds at most `bound` bytes, and temporary files left by processes that died."""
    bound = bound_bytes() if bound is None else bound
    now, entries, total = time.time(), {}, 0
    for path in cache_dir().rglob("*"):
        try:
            stat = path.stat()
        except OSError:
            continue
        if not S_ISREG(stat.st_mode):
            continue
        if path.name.endswith(".tmp"):
            if now - stat.st_mtime > STALE_TEMP_SECONDS:
                _unlink(path)
            continue
        total += stat.st_size
        entry = _entry_of(path)
        used, size = entries.get(entry, (0.0, 0))
        entries[entry] = (max(used, stat.st_mtime), size + stat.st_size)   # a hit touches the manifest
    for entry, (_, size) in sorted(entries.items(), key=lambda e: e[1][0])[:-1]:   # never the newest
        if total <= bound:
            break
        for path in entry.parent.glob(entry.name + ".*"):
            _unlink(path)
            _valid.pop(path, None)
        total -= size


def _entry_of(path: Path) -> Path:
    """Files of one entry share their name up to the first dot: ct_<key>.so, .c and .so.json;
    a measurement is an entry of one file."""
    return path.parent / path.name.split(".", 1)[0]


def _manifest(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _remember(path: Path):
    stat = path.stat()
    _valid[path] = (stat.st_size, stat.st_mtime_ns)


def _unlink(path: Path):
    try:
        path.unlink()
    except OSError:
        pass
