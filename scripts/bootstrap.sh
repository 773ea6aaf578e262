#!/usr/bin/env bash
# Idempotent set-up shared by scripts/run and scripts/test.
#
# Installs, only when missing or out of date:
#   - Debian packages needed to create a virtualenv and build the regtest nodes, and chromium
#     (the console's browser tests);
#   - the Python virtualenv in .venv with this project and its dev extras;
#   - the compiled matching core (matching/_compiled, Cython, see setup.py), rebuilt in place
#     with the machine's C compiler whenever it is missing or older than its sources;
#   - the regtest nodes (bitcoind built from source once into a cache, anvil and solc from npm),
#     through `python -m regtest install`, which prints its progress.
# Safe to run any number of times; a second run does almost nothing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '[bootstrap] %s\n' "$*" >&2; }

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

# The interpreter: the distribution's CPython when there is one (Debian builds it with
# profile-guided optimisation and link-time optimisation; the matching engine measured ~12% faster
# on it than on a plain source build of the same 3.11), else python3 on PATH. PYTHON overrides.
pick_python() {
    if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"
    elif [ -x /usr/bin/python3 ]; then echo /usr/bin/python3
    else echo python3; fi
}
PY="$(pick_python)"

need_debs=()
command -v "$PY" >/dev/null 2>&1 || need_debs+=(python3)
"$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 || need_debs+=(python3-venv)
command -v npm >/dev/null 2>&1 || need_debs+=(nodejs npm)
# The operator console's browser tests drive Debian's Chromium with Playwright (tests/browser.py).
[ -x /usr/bin/chromium ] || need_debs+=(chromium)
if [ -z "${BITCOIND:-}" ] && ! command -v bitcoind >/dev/null 2>&1; then
    # Build dependencies of bitcoind (built from source by `python -m regtest install`).
    for deb in build-essential cmake pkgconf libboost-dev libevent-dev libsqlite3-dev; do
        dpkg -s "$deb" >/dev/null 2>&1 || need_debs+=("$deb")
    done
fi
# The compiled matching core needs a C compiler and the interpreter's headers (Python.h).
command -v cc >/dev/null 2>&1 || need_debs+=(build-essential)
"$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    >/dev/null 2>&1 || need_debs+=(python3-dev)
if [ "${#need_debs[@]}" -gt 0 ]; then
    log "installing Debian packages: ${need_debs[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_debs[@]}" >/dev/null
fi

PY="$(pick_python)"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
    || { log "Python 3.11 or newer is required (found $("$PY" --version))"; exit 1; }

# A virtualenv made by another interpreter is made again (its packages belong to that one).
interpreter="$("$PY" -c 'import sys; print(sys.base_prefix, sys.version.split()[0])')"
if [ -x .venv/bin/python ] && [ "$(cat .venv/.interpreter 2>/dev/null)" != "$interpreter" ]; then
    log "recreating .venv for $PY ($interpreter)"
    rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
    log "creating virtualenv .venv with $PY ($interpreter)"
    "$PY" -m venv .venv
    printf '%s' "$interpreter" > .venv/.interpreter
fi
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    log "installing Python dependencies into .venv"
    if ! { .venv/bin/python -m pip install -q --upgrade pip \
           && .venv/bin/python -m pip install -q -e '.[dev]'; } >.venv/pip.log 2>&1; then
        cat .venv/pip.log >&2; log "pip install failed (log above)"; exit 1
    fi
    rm -f .venv/.installed-*
    touch "$stamp"
fi

# The compiled matching core: `pip install -e` builds it too, but only when pyproject.toml
# changes; this builds it whenever it is missing or older than its sources (each compiled module
# carries the sha256 of the source and declarations it was built from, which `matching.compiled`
# compares with the files: a stale build is never run, the service would fall back to the pure
# engine), then checks that the service will pick it.
core_current='import sys; from matching.compiled import compiled_engine; sys.exit(compiled_engine()[0] is None)'
if ! .venv/bin/python -c "$core_current" 2>/dev/null; then
    log "building the compiled matching core (Cython)"
    if ! .venv/bin/python setup.py -q build_ext --inplace >.venv/build_ext.log 2>&1; then
        cat .venv/build_ext.log >&2; log "building the compiled matching core failed (log above)"; exit 1
    fi
fi
if ! MATCHING_ENGINE=compiled .venv/bin/python -c 'from matching.compiled import engine_class; engine_class()'; then
    cat .venv/build_ext.log >&2 2>/dev/null || true
    log "the compiled matching core does not load (see above)"; exit 1
fi

if [ -f regtest/install.py ]; then
    .venv/bin/python -m regtest install
fi
