"""Where raw files come from: mirror directory, then cache, then canonical URL; md5 always checked.

Resolution order for a file ``<dir>/<name>``:

1. the mirror directory ``$DPFAIR_DATA_MIRROR/<dir>/<name>`` (default: ``<repo>/../shared/datasets``
   when it exists; the repo root is found from this package's location, never from the cwd;
   ``DPFAIR_DATA_MIRROR=""`` disables the mirror);
2. the download cache ``$DPFAIR_CACHE/<dir>/<name>`` (default ``$XDG_CACHE_HOME/dpfair`` or
   ``~/.cache/dpfair``);
3. the canonical URL (then any fallback URL), downloaded to a temporary file in the cache
   directory, md5-checked, then atomically renamed into place. ``DPFAIR_OFFLINE=1`` skips this.

A file found with the wrong md5 is an error (never silently replaced); the canonical md5 sums are
those of ``../shared/datasets/SOURCES.md``.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from dpfair.errors import ChecksumError, DownloadError, SourceMissingError
from dpfair.user_cache import cache_dir

DOWNLOAD_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SourceFile:
    """One raw file: the dataset it belongs to, its directory in the mirror, URL and md5."""

    dataset: str
    dirname: str
    filename: str
    url: str
    md5: str
    fallback_urls: tuple[str, ...] = field(default=())

    @property
    def urls(self) -> tuple[str, ...]:
        return (self.url, *self.fallback_urls)


_UCI = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
_DUTCH = (
    "https://raw.githubusercontent.com/tailequy/fairness_dataset/main/Dutch_census/"
)
_MNIST = "https://yann.lecun.com/exdb/mnist/"
_MNIST_FALLBACK = "https://ossci-datasets.s3.amazonaws.com/mnist/"
_FASHION = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"


#: The four files of an IDX dataset (MNIST's format), in their order.
_IDX_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
              "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def _idx(dataset: str, dirname: str, base: str, fallback: str | None,
         md5s: tuple[str, ...]) -> list[tuple[str, str, str, str, str, str | None]]:
    """The rows of an IDX dataset's four files (``md5s`` in ``_IDX_FILES``' order)."""
    return [(dataset, dirname, f, base, m, fallback) for f, m in zip(_IDX_FILES, md5s, strict=True)]


def _records() -> dict[tuple[str, str], SourceFile]:
    rows = [
        ("adult", "adult", "adult.data", _UCI, "5d7c39d7b8804f071cdd1f2a7c460872", None),
        ("adult", "adult", "adult.test", _UCI, "35238206dfdf7f1fe215bbb874adecdc", None),
        ("dutch", "dutch", "dutch_census_2001.arff", _DUTCH,
         "ff7daa26f4a3119448a20302a1fa7574", None),
        *_idx("mnist", "mnist", _MNIST, _MNIST_FALLBACK, (
            "f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432",
            "9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c")),
        *_idx("fashion_mnist", "fashion-mnist", _FASHION, None, (
            "8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe",
            "bef4ecab320f06d8554ea6380940ec79", "bb300cfdad3c16e7a12a480ee83cd310")),
    ]
    out = {}
    for dataset, dirname, filename, base, md5, fallback in rows:
        fallbacks = (fallback + filename,) if fallback else ()
        out[(dataset, filename)] = SourceFile(
            dataset, dirname, filename, base + filename, md5, fallbacks
        )
    return out


SOURCES: dict[tuple[str, str], SourceFile] = _records()


def source(dataset: str, filename: str) -> SourceFile:
    """The record of one raw file of ``dataset``."""
    try:
        return SOURCES[(dataset, filename)]
    except KeyError:
        known = sorted(f for d, f in SOURCES if d == dataset)
        raise KeyError(f"no source record for {dataset}/{filename}; known: {known}") from None


def sources_of(dataset: str) -> list[SourceFile]:
    """All raw-file records of ``dataset`` (empty for datasets that need no files)."""
    return [s for (d, _), s in SOURCES.items() if d == dataset]


def repo_root() -> Path:
    """The repository root, found from this file's location (``<repo>/dpfair/data``)."""
    return Path(__file__).resolve().parents[2]


def mirror_dir() -> Path | None:
    """The mirror directory, or None when there is none."""
    env = os.environ.get("DPFAIR_DATA_MIRROR")
    if env is not None:
        return Path(env).expanduser() if env.strip() else None
    default = repo_root().parent / "shared" / "datasets"
    return default if default.is_dir() else None


def md5sum(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, expected: str) -> Path:
    """Raise ChecksumError unless ``path`` has md5 ``expected``."""
    actual = md5sum(path)
    if actual != expected:
        raise ChecksumError(
            f"corrupt file {path}: md5 is {actual}, expected {expected}. "
            "Replace it with the canonical file (see shared/datasets/SOURCES.md) "
            "or delete it to download it again."
        )
    return path


def _downloads_enabled() -> bool:
    return os.environ.get("DPFAIR_OFFLINE", "").strip().lower() not in {"1", "true", "yes"}


def download(url: str, dest: Path, md5: str, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Fetch ``url`` to ``dest`` via a temporary file in the same directory, check md5, rename.

    Nothing is left at ``dest`` (nor a temporary file) unless the md5 matches.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            shutil.copyfileobj(resp, out)
        actual = md5sum(tmp)
        if actual != md5:
            raise ChecksumError(
                f"corrupt download from {url}: md5 is {actual}, expected {md5}; "
                f"nothing was written to {dest}"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch(dataset: str, filename: str) -> Path:
    """The local path of a verified raw file, downloading it into the cache if needed."""
    rec = source(dataset, filename)
    looked: list[str] = []
    mirror = mirror_dir()
    if mirror is not None:
        path = mirror / rec.dirname / rec.filename
        if path.is_file():
            return verify(path, rec.md5)
        looked.append(f"mirror {path} (absent)")
    else:
        looked.append("mirror: none (DPFAIR_DATA_MIRROR unset and no ../shared/datasets)")
    cached = cache_dir() / rec.dirname / rec.filename
    if cached.is_file():
        return verify(cached, rec.md5)
    looked.append(f"cache {cached} (absent)")

    if not _downloads_enabled():
        looked.append("download skipped (DPFAIR_OFFLINE is set)")
        raise SourceMissingError(_missing_message(rec, looked))
    failures = []
    for url in rec.urls:
        try:
            return download(url, cached, rec.md5)
        except ChecksumError:
            raise
        except (OSError, ValueError, http.client.HTTPException) as exc:
            # URLError, HTTPError and timeouts are OSErrors; ValueError: malformed URL
            failures.append(f"URL {url} (unreachable: {exc})")
    raise DownloadError(_missing_message(rec, looked + failures))


def _missing_message(rec: SourceFile, looked: list[str]) -> str:
    lines = "\n  ".join(looked)
    return (
        f"cannot find {rec.filename} of dataset {rec.dataset!r} (md5 {rec.md5}); looked in:\n"
        f"  {lines}\n"
        f"Put the file at <mirror>/{rec.dirname}/{rec.filename} (set DPFAIR_DATA_MIRROR) "
        "or allow the download."
    )
