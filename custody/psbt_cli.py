"""Operators: move bitcoin from the watch-only cold wallet to hot through a PSBT, over the HTTP API.

    python -m custody psbt open AMOUNT_BTC --out FILE      build and open a cold -> hot move; write
                                                           its unsigned PSBT (base64) to FILE
    python -m custody psbt export REBALANCE_ID --out FILE  write an open move's unsigned PSBT to FILE
    python -m custody psbt import REBALANCE_ID FILE        send the signed PSBT in FILE (base64)
    common options: [--api URL] [--api-key-file F]         (else $CUSTODY_API, $CUSTODY_API_KEY)

Between `export` and `import` the operator signs FILE offline with the cold key (Bitcoin Core:
`walletprocesspsbt` in a wallet holding the cold descriptor; a hardware wallet). Custody refuses a
PSBT whose transaction is not exactly the one it built, or whose signatures do not verify (the
`psbt_*` codes, README "Error codes"); the worker broadcasts an accepted one and books it at
finality (cold location -> hot location, fee -> network-fee expense).

Exit status: 0 done; 1 the API refused (its code and message are printed); 2 a usage, file or
connection problem. `main(argv)` is what `python -m custody psbt ...` runs.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import httpx

from custody.approve_cli import DEFAULT_API, CliError, _answer, _api_key, exit_status, shown


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m custody psbt", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    opened = sub.add_parser("open", help="open a cold -> hot move and write its unsigned PSBT")
    opened.add_argument("amount", help="BTC, a decimal string")
    exported = sub.add_parser("export", help="write an open move's unsigned PSBT")
    exported.add_argument("rebalance_id", type=int)
    for p in (opened, exported):
        p.add_argument("--out", required=True, help="file to write the PSBT (base64) to; never overwritten")
    imported = sub.add_parser("import", help="send a signed PSBT")
    imported.add_argument("rebalance_id", type=int)
    imported.add_argument("file", help="the signed PSBT, base64")
    for p in (opened, exported, imported):
        p.add_argument("--api", default=os.environ.get("CUSTODY_API", DEFAULT_API), help="the custody API's base URL")
        p.add_argument("--api-key-file", help="file holding the operator's API key (else env CUSTODY_API_KEY)")
    return parser


def _write(path: str, psbt: str) -> None:
    try:
        with open(path, "x") as f:
            f.write(psbt + "\n")
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror}") from None


def run(client: httpx.Client, args: argparse.Namespace) -> str:
    """One command against the API; the line to print."""
    if args.command == "open":
        body = _answer(client.post("/v1/rebalances/cold-to-hot", json={"amount": args.amount}))
        _write(args.out, body["psbt"])
        return f"cold -> hot {body['rebalance']['id']} opened: {shown(body['rebalance']['amount'])} BTC; PSBT in {args.out}"
    if args.command == "export":
        body = _answer(client.get(f"/v1/rebalances/{args.rebalance_id}/psbt"))
        _write(args.out, body["psbt"])
        return f"cold -> hot {args.rebalance_id}: PSBT in {args.out}"
    try:
        psbt = Path(args.file).read_text().strip()
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    body = _answer(client.post(f"/v1/rebalances/{args.rebalance_id}/psbt", json={"psbt": psbt}))
    return f"cold -> hot {args.rebalance_id} is {shown(body['rebalance']['state'])}: {shown(body['rebalance']['txid'])}"


def main(argv: list[str] | None = None, *, http: httpx.Client | None = None) -> int:
    """Run one command; `http` replaces the client built from --api (tests pass the app's client)."""
    args = _parser().parse_args(argv)

    def work() -> int:
        headers = {"X-API-Key": _api_key(args)}
        if http is not None:
            http.headers.update(headers)
            print(run(http, args))
        else:
            with httpx.Client(base_url=args.api, headers=headers, timeout=30) as client:
                print(run(client, args))
        return 0

    return exit_status(work, args.api)

if __name__ == "__main__":
    sys.exit(main())
