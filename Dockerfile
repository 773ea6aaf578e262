# The service image: custody-api, custody-worker and custody-signer (docker-compose.yml runs the
# three commands of custody/topology.py PROCESS_COMMANDS with it), plus bitcoind/bitcoin-cli for the
# compose file's regtest node.
#
# bitcoind is built from source exactly as `python -m regtest install` builds it on a developer's
# machine (regtest/install.py: the Bitcoin Core tree shipped in the py-bitcoinkernel sdist, pinned by
# sha256), in a build stage whose compilers stay out of the final image. About 10 minutes on 2 cores.
#
#   docker build -t custody-service:dev .        (docker compose build does the same)
#
# The default command is the API; compose gives each service its own. No ENTRYPOINT, so a compose
# `command` is the whole argv (tests/unit/test_compose_file.py checks both).

FROM python:3.11-slim-bookworm AS bitcoind
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake pkgconf libboost-dev libevent-dev libsqlite3-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY regtest/__init__.py regtest/install.py regtest/
RUN CUSTODY_CACHE_DIR=/build/cache python -c "from regtest.install import build_bitcoind; build_bitcoind()" \
    && mkdir /out && cp /build/cache/bitcoind-*/bin/bitcoind /build/cache/bitcoind-*/bin/bitcoin-cli /out/

FROM python:3.11-slim-bookworm AS service
# bitcoind's and bitcoin-cli's shared libraries (`ldd`; boost is header-only).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libevent-core-2.1-7 libevent-extra-2.1-7 libevent-pthreads-2.1-7 libsqlite3-0 libstdc++6 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=bitcoind /out/ /usr/local/bin/
# One unprivileged user for every process; the directories compose mounts volumes on are its own so
# the volumes start owned by it (the seed secret is mounted for this uid: see docker-compose.yml).
RUN useradd --system --uid 10001 --user-group --home-dir /app custody \
    && install -d -o custody -g custody /app /var/lib/bitcoind /run/custody-signer
WORKDIR /app
# Installed editable from /app: migrations/ and alembic.ini are found beside the packages.
COPY pyproject.toml alembic.ini ./
COPY migrations/ migrations/
COPY ledger/ ledger/
COPY matching/ matching/
COPY policies/ policies/
COPY signer/ signer/
COPY chain_adapters/ chain_adapters/
COPY custody/ custody/
COPY regtest/ regtest/
RUN pip install --no-cache-dir -e . && python -c "import custody, signer"
USER custody
ENV PYTHONUNBUFFERED=1
EXPOSE 8000
CMD ["python", "-m", "custody", "api", "--config", "/etc/custody/custody.toml"]
