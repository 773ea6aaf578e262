"""Scripted approvers: approve a withdrawal with your own Ed25519 key, over the HTTP API only.

    custody approve --key FILE WITHDRAWAL_ID [--api URL] [--api-key-file F] [--comment TEXT] [--key-id ID]
                    [--decimals ASSET=N ...]
        GET the withdrawal's approval payload, read the payload BYTES, show what they pay (asset,
        amount, destination, chain, decision, policy version, expiry), sign those exact bytes with
        the private key in FILE and POST the approval. The operator API key comes from
        --api-key-file or the CUSTODY_API_KEY environment variable; custody refuses a key that is
        not the caller's own (`approver_not_caller`).
    custody approver-key new FILE --operator NAME [--key-id ID]
        Write a new Ed25519 private key to FILE (PEM, PKCS#8, mode 0600; never overwritten) and
        print the approver entry to add, as TOML, to the approver lists of custody AND the signer:
        key_id, operator (the operator's API key name), scheme, public_key (base64).

The private key never leaves this process: only the signature is sent. A key file readable or
writable by group or others is refused, as the signer refuses such a seed file. The key id defaults
to `ed25519:` + the first 16 hex digits of SHA-256 of the public key, so `approve` finds it from the
key file alone.

The API is not trusted with what is signed (a compromised API process could show one withdrawal and
hand over the bytes of another). What the operator is shown comes from the payload bytes alone
(`signer.approvals.read_payload`), and nothing is signed unless: the bytes are exactly the canonical
payload of their fields; they name the WITHDRAWAL_ID asked for; and every field the API's JSON also
states (withdrawal_id, decision_id, chain, asset, amount_minor, destination, policy_version,
expires_at) says the same as the bytes. The amount is shown in units only with decimals this command
knows without asking the API (the chains' native assets, `NATIVE_DECIMALS`, and `--decimals`),
always also in minor units; for any other asset in minor units only, since decimals served by the API
could shift the shown amount by orders of magnitude.

Nothing the API sends reaches the terminal raw (`shown`): every string from it (the payload's
fields, the JSON's `state`, an error's code and message) is printed with printable ASCII as is and
everything else escaped as Python writes it (`\\x1b`, `\\u202e`, a backslash doubled). A compromised
API could otherwise put terminal control sequences (ESC[1A, CR, ESC[2K: cursor up, erase line) or
bidi overrides into a free-text field and redraw the lines above it to show another amount or
destination than the bytes being signed. The payload itself is refused before it is shown when
its text holds control or format characters (signer.approvals.read_payload), so such a payload is
never signed; the escaping covers whatever else the API says.

`approve_adjustment_with_client` approves a treasury adjustment the same way through the typed
client (the payload must be the canonical adjustment payload naming the id asked for; its legs are
shown in minor units); the demo uses it.

Exit status: 0 done; 1 the API refused (its code and message are printed); 2 a usage, file or
connection problem; 3 the API served a payload this command will not sign (another withdrawal, not
canonical, or JSON fields that contradict the bytes): nothing was signed or sent, and the API
should be treated as suspect. `main(argv)` is what `python -m custody` delegates the two
subcommands to.
"""
from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (Encoding, NoEncryption, PrivateFormat, PublicFormat,
                                                          load_pem_private_key)

from ledger.amounts import format_amount
from signer.approvals import (PayloadFields, convert_price_payload, format_expiry, parse_payload, read_adjustment_payload,
                              read_payload)

if TYPE_CHECKING:
    from custody.client import CustodyClient
    from custody.client.models import AdjustmentOut, WithdrawalOut

COMMANDS = ("approve", "approver-key")  # the subcommands of `python -m custody` that main() serves
DEFAULT_API = "http://127.0.0.1:8000"
NATIVE_DECIMALS = {("bitcoin", "BTC"): 8, ("ethereum", "ETH"): 18}  # protocol facts, not settings: (chain, asset)


def shown(value: object) -> str:
    """`value` as text safe for a terminal (module docstring): printable ASCII as is, a backslash
    doubled, anything else escaped (`\\x1b`, `\\u202e`, `\\U0001f600`), so it cannot move the cursor,
    erase, reorder or pass for another character."""
    out = []
    for ch in str(value):
        if ch == "\\":
            out.append("\\\\")
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            n = ord(ch)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
    return "".join(out)


class CliError(Exception):
    """A problem with the command's input (exit 2)."""


class PayloadRefused(Exception):
    """The API served a payload this command will not sign (exit 3; module docstring)."""


def key_id_of(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read the key file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CliError(f"the key file {path} is readable or writable by others (mode {stat.S_IMODE(mode):o}): chmod 600 it")
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise CliError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CliError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def new_key_file(path: Path) -> Ed25519PrivateKey:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CliError(f"{path} exists; a key file is never overwritten") from None
    except OSError as exc:
        raise CliError(f"cannot create {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return key


def approver_entry(key: Ed25519PrivateKey, operator: str, key_id: str | None = None) -> dict[str, str]:
    """The key's entry in an `approvers` list (signer and custody configs): its public half only."""
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return {"key_id": key_id or key_id_of(key), "operator": operator, "scheme": "ed25519",
            "public_key": base64.b64encode(raw).decode()}


def toml_entry(key: Ed25519PrivateKey, operator: str, key_id: str | None = None) -> str:
    entry = approver_entry(key, operator, key_id)
    return "\n".join(["[[approvers]]", *(f'{k} = "{v}"' for k, v in entry.items()), ""])


def _answer(r: httpx.Response) -> dict:
    try:
        body = r.json()
    except ValueError:
        body = {}
    if r.status_code >= 400:
        err = body.get("error", {}) if isinstance(body, dict) else {}
        raise ApiRefused(r.status_code, err.get("code", "http_error"), err.get("message", r.text[:200]))
    return body


class ApiRefused(Exception):
    """The API answered 4xx/5xx (exit 1)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status, self.code, self.message = status, code, message
        super().__init__(f"{status} {code}: {message}")


def checked_payload(answer: object, withdrawal_id: int) -> tuple[bytes, PayloadFields]:
    """The payload bytes of an approval-payload answer and what they say, or PayloadRefused unless
    they are canonical, name `withdrawal_id`, and the answer's JSON fields agree (module docstring)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("payload_base64"), str):
        raise PayloadRefused("the API's answer has no payload_base64")
    try:
        payload = base64.b64decode(answer["payload_base64"], validate=True)
    except ValueError:
        raise PayloadRefused("the API's payload_base64 is not base64") from None
    try:
        fields = read_payload(payload)
    except ValueError as exc:
        raise PayloadRefused(f"the API's payload is not a canonical approval payload: {exc}") from None
    if fields.withdrawal_id != withdrawal_id:
        raise PayloadRefused(f"asked for withdrawal {withdrawal_id}, the API's payload is for withdrawal {fields.withdrawal_id} "
                             f"({fields.amount} minor units of {shown(fields.asset)} to {shown(fields.destination)})")
    said = {"withdrawal_id": fields.withdrawal_id, "decision_id": fields.decision_id, "chain": fields.chain,
            "asset": fields.asset, "amount_minor": str(fields.amount), "destination": fields.destination,
            "policy_version": fields.policy_version, "expires_at": format_expiry(fields.expires_at)}
    contradicted = [f"{name}: API says {answer[name]!r}, payload says {value!r}"
                    for name, value in said.items() if name in answer and answer[name] != value]
    if contradicted:
        raise PayloadRefused("the API's fields contradict the payload it asks to sign: " + "; ".join(contradicted))
    return payload, fields


def describe_amount(fields: PayloadFields, decimals: Mapping[str, int] | None = None) -> str:
    """The payload's amount in units when its decimals are known here, else in minor units."""
    known = {**{a: d for (c, a), d in NATIVE_DECIMALS.items() if c == fields.chain}, **(decimals or {})}
    asset = shown(fields.asset)
    if fields.asset in known:
        return f"{format_amount(fields.amount, known[fields.asset])} {asset}"
    return f"{fields.amount} minor units of {asset} (decimals unknown here: pass --decimals {asset}=N)"


def approve_over_http(client: httpx.Client, withdrawal_id: int, key: Ed25519PrivateKey, *, comment: str,
                      key_id: str | None = None, show=print, decimals: Mapping[str, int] | None = None) -> dict:
    """GET the payload, check it (`checked_payload`: PayloadRefused otherwise), `show` what its bytes
    pay, sign those exact bytes, POST the approval; the withdrawal."""
    answer = _answer(client.get(f"/v1/withdrawals/{withdrawal_id}/approval-payload"))
    signature = signed_approval(answer, withdrawal_id, key, key_id=key_id, show=show, decimals=decimals)
    return _answer(client.post(f"/v1/withdrawals/{withdrawal_id}/approve", json={"comment": comment, "signature": signature}))


def approve_with_client(api: CustodyClient, withdrawal_id: int, key: Ed25519PrivateKey, *, comment: str,
                        key_id: str | None = None, show=print, decimals: Mapping[str, int] | None = None) -> WithdrawalOut:
    """`approve_over_http` through the typed client (`custody.client`, the operator's key): the same
    checks on the payload before anything is signed; the API's refusals raise the client's
    `CustodyApiError` (with its code) instead of `ApiRefused`. The payload answer is checked as the
    client parsed it (`amount_minor` an integer sent back as its decimal string)."""
    answer = api.get_approval_payload(withdrawal_id).model_dump(mode="json")
    signature = signed_approval(answer, withdrawal_id, key, key_id=key_id, show=show, decimals=decimals)
    return api.approve_withdrawal(withdrawal_id, comment=comment, signature=signature)


def signed_approval(answer: object, withdrawal_id: int, key: Ed25519PrivateKey, *, key_id: str | None = None,
                    show=print, decimals: Mapping[str, int] | None = None) -> dict[str, str]:
    """Check an approval-payload answer (`checked_payload`), `show` what its bytes pay, and sign those
    exact bytes: the `signature` object of the approve request."""
    payload, f = checked_payload(answer, withdrawal_id)
    state = answer.get("state", "state unknown") if isinstance(answer, dict) else "state unknown"
    show(f"withdrawal {f.withdrawal_id} ({shown(state)}): pay {describe_amount(f, decimals)} "
         f"on {shown(f.chain)} to {shown(f.destination)}")
    show(f"amount {f.amount} minor units; decision {f.decision_id} under policy {shown(f.policy_version)}, valid until "
         f"{format_expiry(f.expires_at)}")
    return ed25519_signature(key, payload, key_id)


def ed25519_signature(key: Ed25519PrivateKey, payload: bytes, key_id: str | None = None) -> dict[str, str]:
    """The `signature` object of an approve request: `key`'s Ed25519 signature over `payload`."""
    return {"key_id": key_id or key_id_of(key), "scheme": "ed25519", "signature": base64.b64encode(key.sign(payload)).decode()}


def approve_adjustment_with_client(api: CustodyClient, adjustment_id: int, key: Ed25519PrivateKey, *, comment: str,
                                   key_id: str | None = None, show=print) -> AdjustmentOut:
    """Approve treasury adjustment `adjustment_id` through the typed client with the operator's own
    key: its payload bytes must be the canonical adjustment payload naming that id
    (signer.approvals.read_adjustment_payload; PayloadRefused otherwise), `show` says what they move
    (amounts in minor units), and those exact bytes are signed and sent."""
    answer = api.adjustment_approval_payload(adjustment_id)
    try:
        payload = base64.b64decode(answer.payload_base64, validate=True)
        fields = read_adjustment_payload(payload)
    except ValueError as exc:
        raise PayloadRefused(f"the API's payload is not a canonical adjustment payload: {exc}") from None
    if fields.adjustment_id != adjustment_id:
        raise PayloadRefused(f"asked for adjustment {adjustment_id}, the API's payload is for {fields.adjustment_id}")
    show(f"adjustment {fields.adjustment_id} proposed by {shown(fields.proposed_by)} ({fields.quorum} approval(s) needed): "
         f"{shown(fields.reason)}")
    for debit, credit, amount in fields.legs:
        show(f"  {amount} minor units: account {debit} -> account {credit}")
    return api.approve_adjustment(adjustment_id, comment=comment, signature=ed25519_signature(key, payload, key_id))


def approve_convert_price_with_client(api: CustodyClient, change_id: int, key: Ed25519PrivateKey, *, comment: str,
                                      key_id: str | None = None, show=print):
    """Sign convert price change `change_id` through the typed client with the operator's own key:
    its payload bytes must be the canonical `convert-price` payload naming that id
    (signer.approvals.convert_price_payload rebuilt from its fields; PayloadRefused otherwise),
    `show` says which price they set, and those exact bytes are signed and sent. The worker then
    verifies the signature again and sets the price (custody.convert.prices)."""
    answer = api.convert_price_approval_payload(change_id)
    try:
        payload = base64.b64decode(answer.payload_base64, validate=True)
        fields = parse_payload(payload) or {}
        expires_at = dt.datetime.strptime(fields["expires_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)
        canonical = convert_price_payload(change_id=fields["change_id"], base_asset=fields["base_asset"],
                                          quote_asset=fields["quote_asset"], price_minor=int(fields["price"]),
                                          proposed_by=fields["proposed_by"], expires_at=expires_at)
    except (KeyError, TypeError, ValueError) as exc:
        raise PayloadRefused(f"the API's payload is not a canonical convert price payload: {exc}") from None
    if canonical != payload or fields.get("kind") != "convert-price":
        raise PayloadRefused("the API's payload is not in canonical form: its bytes could say more than its fields")
    if fields["change_id"] != change_id:
        raise PayloadRefused(f"asked for price change {change_id}, the API's payload is for {fields['change_id']}")
    show(f"price change {change_id} proposed by {shown(fields['proposed_by'])}: {shown(fields['base_asset'])} = "
         f"{fields['price']} minor units of {shown(fields['quote_asset'])}, expires {fields['expires_at']}")
    return api.approve_convert_price(change_id, comment=comment, signature=ed25519_signature(key, payload, key_id))


def _decimals(values: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        asset, sep, n = value.partition("=")
        if not sep or not asset.strip() or not n.strip().isdigit() or int(n) > 36:
            raise CliError(f"--decimals {value!r}: write ASSET=N, N from 0 to 36 (e.g. USDT=6)")
        out[asset.strip()] = int(n)
    return out


def _api_key(args) -> str:
    if args.api_key_file:
        try:
            value = Path(args.api_key_file).read_text().strip()
        except OSError as exc:
            raise CliError(f"cannot read the API key file {args.api_key_file}: {exc.strerror}") from None
    else:
        value = os.environ.get("CUSTODY_API_KEY", "").strip()
    if not value:
        raise CliError("no operator API key: pass --api-key-file or set CUSTODY_API_KEY")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m custody", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    approve = sub.add_parser("approve", help="sign and send an approval of a withdrawal")
    approve.add_argument("--key", required=True, type=Path, help="the approver's Ed25519 private key (PEM)")
    approve.add_argument("withdrawal_id", type=int)
    approve.add_argument("--api", default=os.environ.get("CUSTODY_API", DEFAULT_API), help="the custody API's base URL")
    approve.add_argument("--api-key-file", help="file holding the operator's API key (else env CUSTODY_API_KEY)")
    approve.add_argument("--comment", default="approved with custody approve", help="recorded in the audit log")
    approve.add_argument("--key-id", help="the key id registered for the key (default: derived from the key)")
    approve.add_argument("--decimals", action="append", default=[], metavar="ASSET=N",
                         help="show ASSET's amounts in units with N decimals (BTC and ETH are known; repeatable)")
    keys = sub.add_parser("approver-key", help="manage approver keys")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    new = keys_sub.add_parser("new", help="write a new Ed25519 key and print its approver entry")
    new.add_argument("file", type=Path)
    new.add_argument("--operator", required=True, help="the operator's API key name")
    new.add_argument("--key-id", help="the key id to register (default: derived from the key)")
    return parser


def exit_status(work: Callable[[], int], api: str) -> int:
    """Run one command's `work` and map what it raises to the exit status (module docstring): a
    usage, file or connection problem 2, the API's refusal 1. Shared with custody.psbt_cli."""
    try:
        return work()
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ApiRefused as exc:
        print(f"refused: {shown(exc)}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"error: cannot reach the API at {shown(api)}: {shown(exc)}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None, *, http: httpx.Client | None = None) -> int:
    """Run one command; `http` replaces the client built from --api (tests pass the app's client)."""
    args = _parser().parse_args(argv)

    def work() -> int:
        if args.command == "approver-key":
            key = new_key_file(args.file)
            print(f"# wrote {args.file} (mode 600); add this entry to custody's and the signer's approver lists:",
                  file=sys.stderr)
            print(toml_entry(key, args.operator, args.key_id), end="")
            return 0
        key = load_private_key(args.key)
        headers = {"X-API-Key": _api_key(args)}
        options = dict(comment=args.comment, key_id=args.key_id, decimals=_decimals(args.decimals))
        try:
            if http is not None:
                http.headers.update(headers)
                answer = approve_over_http(http, args.withdrawal_id, key, **options)
            else:
                with httpx.Client(base_url=args.api, headers=headers, timeout=30) as client:
                    answer = approve_over_http(client, args.withdrawal_id, key, **options)
        except PayloadRefused as exc:
            print(f"error: NOT SIGNED: {shown(exc)}. Nothing was sent; treat the API at {shown(args.api)} as suspect.",
                  file=sys.stderr)
            return 3
        body = answer if isinstance(answer, dict) else {}
        print(f"approved: withdrawal {shown(body.get('id', args.withdrawal_id))} is {shown(body.get('state', 'state unknown'))}")
        return 0

    return exit_status(work, getattr(args, "api", ""))  # approver-key talks to no API

if __name__ == "__main__":
    sys.exit(main())
