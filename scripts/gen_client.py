"""Write custody/client/models.py and custody/client/_methods.py from the served OpenAPI document.

Run from the repository root after changing a route or a schema of the API:

    python scripts/gen_client.py

The generator is ours, not a generic OpenAPI generator, because the client's types follow rules a
generic tool does not know: decimal-string amounts become `Decimal` (`custody.client.types.Amount`),
minor-unit strings become `int` (`Minor`), `{value, minor}` is the one `Money` model, and every
idempotency key of a request body gets a fresh uuid4 when the caller gives none. Method names are
the `NAMES` table below: a route missing from it stops the generator (KeyError), and
`tests/unit/test_client_contract.py` fails until the files are written again.
"""
from __future__ import annotations

import keyword
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (METHOD, path) -> client method name. One line per route of the served document.
NAMES: dict[tuple[str, str], str] = {
    ("POST", "/v1/assets"): "create_asset",
    ("GET", "/v1/assets"): "list_assets",
    ("POST", "/v1/accounts"): "open_account",
    ("GET", "/v1/firm-accounts"): "list_firm_accounts",
    ("GET", "/v1/accounts/{account_id}"): "get_account",
    ("POST", "/v1/accounts/{account_id}/close"): "close_account",
    ("GET", "/v1/accounts/{account_id}/balance"): "get_balance",
    ("GET", "/v1/accounts/{account_id}/statement"): "get_statement",
    ("POST", "/v1/transactions"): "post_transaction",
    ("GET", "/v1/transactions/{transaction_id}"): "get_transaction",
    ("POST", "/v1/transactions/{transaction_id}/reverse"): "reverse_transaction",
    ("POST", "/v1/holds"): "place_hold",
    ("GET", "/v1/holds/{hold_id}"): "get_hold",
    ("POST", "/v1/holds/{hold_id}/capture"): "capture_hold",
    ("POST", "/v1/holds/{hold_id}/release"): "release_hold",
    ("GET", "/v1/totals"): "get_totals",
    ("GET", "/v1/verify"): "verify",
    ("POST", "/v1/deposit-addresses"): "issue_deposit_address",
    ("GET", "/v1/accounts/{account_id}/deposits"): "list_account_deposits",
    ("GET", "/v1/deposits"): "list_deposits",
    ("POST", "/v1/deposits/{deposit_id}/release"): "release_deposit",
    ("POST", "/v1/deposits/{deposit_id}/return"): "return_deposit",
    ("GET", "/v1/incidents"): "list_incidents",
    ("POST", "/v1/incidents/{incident_id}/resolve"): "resolve_incident",
    ("POST", "/v1/reconciliation"): "reconcile",
    ("POST", "/v1/reserves/reports"): "publish_reserve_report",
    ("GET", "/v1/reserves/reports/{report_id}"): "get_reserve_report",
    ("GET", "/v1/reserves/reports/{report_id}/proof"): "get_reserve_proof",
    ("GET", "/v1/kill-switch"): "get_kill_switch",
    ("POST", "/v1/kill-switch"): "set_kill_switch",
    ("POST", "/v1/markets"): "create_market",
    ("GET", "/v1/markets"): "list_markets",
    ("POST", "/v1/markets/{symbol}/orders"): "place_order",
    ("GET", "/v1/markets/{symbol}/orders"): "get_order_by_client_id",
    ("POST", "/v1/markets/{symbol}/orders/{order_id}/cancel"): "cancel_order",
    ("POST", "/v1/markets/{symbol}/orders/{order_id}/amend"): "amend_order",
    ("GET", "/v1/markets/{symbol}/orders/{order_id}"): "get_order",
    ("GET", "/v1/markets/{symbol}/fills"): "list_fills",
    ("GET", "/v1/markets/{symbol}/depth"): "get_depth",
    ("POST", "/v1/withdrawals"): "request_withdrawal",
    ("GET", "/v1/withdrawals"): "list_withdrawals",
    ("GET", "/v1/withdrawals/{withdrawal_id}"): "get_withdrawal",
    ("GET", "/v1/withdrawals/{withdrawal_id}/approval-payload"): "get_approval_payload",
    ("POST", "/v1/withdrawals/{withdrawal_id}/approve"): "approve_withdrawal",
    ("POST", "/v1/withdrawals/{withdrawal_id}/reject"): "reject_withdrawal",
    ("PUT", "/v1/accounts/{account_id}/allowlist"): "set_allowlist",
    ("GET", "/v1/accounts/{account_id}/allowlist"): "get_allowlist",
    ("POST", "/v1/accounts/{account_id}/allowlist"): "allow_destination",
    ("DELETE", "/v1/accounts/{account_id}/allowlist/{address}"): "remove_destination",
    ("GET", "/v1/allowlist-changes"): "list_allowlist_changes",
    ("POST", "/v1/allowlist-changes/{change_id}/approve"): "approve_allowlist_change",
    ("POST", "/v1/allowlist-changes/{change_id}/reject"): "reject_allowlist_change",
    ("GET", "/v1/rebalances"): "list_rebalances",
    ("POST", "/v1/rebalances/run"): "run_rebalances",
    ("POST", "/v1/rebalances/{rebalance_id}/abandon"): "abandon_rebalance",
    ("POST", "/v1/rebalances/cold-to-hot"): "open_cold_to_hot",
    ("GET", "/v1/rebalances/{rebalance_id}/psbt"): "export_psbt",
    ("POST", "/v1/rebalances/{rebalance_id}/psbt"): "import_psbt",
    ("GET", "/v1/rebalances/{rebalance_id}/approval-payload"): "refill_approval_payload",
    ("POST", "/v1/rebalances/{rebalance_id}/approve"): "approve_refill",
    ("GET", "/v1/eth-rebalances"): "list_eth_rebalances",
    ("GET", "/v1/eth-rebalances/{rebalance_id}/approval-payload"): "eth_refill_approval_payload",
    ("POST", "/v1/eth-rebalances/{rebalance_id}/approve"): "approve_eth_refill",
    ("POST", "/v1/treasury/hot-funding"): "book_hot_funding",
    ("POST", "/v1/treasury/adjustments"): "propose_adjustment",
    ("GET", "/v1/treasury/adjustments"): "list_adjustments",
    ("GET", "/v1/treasury/adjustments/{adjustment_id}/approval-payload"): "adjustment_approval_payload",
    ("POST", "/v1/treasury/adjustments/{adjustment_id}/approve"): "approve_adjustment",
    ("POST", "/v1/treasury/adjustments/{adjustment_id}/reject"): "reject_adjustment",
    ("GET", "/v1/treasury/adjustments/{adjustment_id}"): "get_adjustment",
    ("GET", "/v1/set-aside"): "list_set_aside",
    ("POST", "/v1/withdrawal-batches/{batch_id}/retry"): "retry_batch",
    ("POST", "/v1/sweeps/{sweep_id}/retry"): "retry_sweep",
    ("POST", "/v1/rebalances/{rebalance_id}/retry"): "retry_rebalance",
    ("POST", "/v1/webhook-endpoints"): "create_webhook_endpoint",
    ("GET", "/v1/webhook-endpoints"): "list_webhook_endpoints",
    ("GET", "/v1/webhook-endpoints/{endpoint_id}"): "get_webhook_endpoint",
    ("PATCH", "/v1/webhook-endpoints/{endpoint_id}"): "update_webhook_endpoint",
    ("DELETE", "/v1/webhook-endpoints/{endpoint_id}"): "delete_webhook_endpoint",
    ("POST", "/v1/webhook-endpoints/{endpoint_id}/rotate-secret"): "rotate_webhook_secret",
    ("GET", "/v1/webhook-endpoints/{endpoint_id}/deliveries"): "list_webhook_deliveries",
    ("POST", "/v1/webhook-deliveries/{delivery_id}/replay"): "replay_webhook_delivery",
    ("POST", "/v1/webhook-endpoints/{endpoint_id}/replay-dead"): "replay_dead_webhook_deliveries",
    ("GET", "/v1/api-keys"): "list_api_keys",
    ("POST", "/v1/api-keys/{key_id}/revoke"): "revoke_api_key",
    ("POST", "/v1/api-keys/{key_id}/rotate"): "rotate_api_key",
    ("POST", "/v1/quotes"): "create_quote",
    ("GET", "/v1/quotes/{quote_id}"): "get_quote",
    ("POST", "/v1/quotes/{quote_id}/accept"): "accept_quote",
    ("POST", "/v1/convert/prices"): "propose_convert_price",
    ("GET", "/v1/convert/prices/changes/{change_id}"): "get_convert_price_change",
    ("GET", "/v1/convert/prices/changes/{change_id}/approval-payload"): "convert_price_approval_payload",
    ("POST", "/v1/convert/prices/changes/{change_id}/approve"): "approve_convert_price",
    ("GET", "/v1/convert/liquidity/{asset}"): "get_convert_liquidity",
    ("GET", "/health/live"): "health_live",
    ("GET", "/health"): "health",
    ("GET", "/health/ready"): "health_ready",
    ("GET", "/metrics"): "metrics",
}

# Schema names that clash or read badly in Python get a client name.
RENAMES = {"custody__api__webhook_routes__RotateIn": "WebhookRotateIn",
           "custody__api__api_key_routes__RotateIn": "ApiKeyRotateIn"}

# Request fields that are idempotency keys (or business ids used as one): the client fills a fresh
# uuid4 when the caller gives none, once per logical call, so every retry of that call sends it again.
KEY_FIELDS = ("idempotency_key", "client_order_id", "client_withdrawal_id")

# Decimal strings in the asset's units (custody.client.types.Amount).
AMOUNT_FIELDS = {"amount", "qty", "price", "stop_price", "budget", "display_qty", "filled", "remaining",
                 "quote_traded", "fees_paid", "quote_amount", "maker_fee", "taker_fee", "fee", "fee_quoted",
                 "from_amount", "to_amount"}
# Strings that are integer minor units although their name does not end in _minor (Minor).
MINOR_FIELDS = {("ReserveProofOut", "balance"), ("ReserveHoldingsOut", "total"), ("ReserveLiabilitiesOut", "total"),
                ("ReserveAddressOut", "amount"), ("ProofNodeOut", "sum"), ("ProofLeafOut", "amount")}


def load_document() -> dict:
    from custody.api.app import create_app
    from custody.container import Container

    return create_app(Container.__new__(Container)).openapi()


def class_name(ref: str) -> str:
    name = ref.rsplit("/", 1)[-1]
    return RENAMES.get(name, name)


def special(model: str, field: str) -> str | None:
    """The money type of a string field, or None for a plain string."""
    if (model, field) in MINOR_FIELDS or field == "minor" or field.endswith("_minor"):
        return "Minor"
    if field in AMOUNT_FIELDS or (model == "Money" and field == "value"):
        return "Amount"
    return None


def py_type(schema: dict, model: str = "", field: str = "") -> str:
    if "$ref" in schema:
        return class_name(schema["$ref"])
    if "anyOf" in schema:
        parts = [py_type(s, model, field) for s in schema["anyOf"]]
        return " | ".join(dict.fromkeys(parts))
    kind = schema.get("type")
    if kind == "null":
        return "None"
    if kind == "string":
        if "enum" in schema:
            return "Literal[" + ", ".join(repr(v) for v in schema["enum"]) + "]"
        if schema.get("format") == "date-time":
            return "datetime"
        return special(model, field) or "str"
    if kind == "integer":
        return "int"
    if kind == "number":
        return "Amount"  # never float
    if kind == "boolean":
        return "bool"
    if kind == "array":
        return f"list[{py_type(schema.get('items', {}), model, field)}]"
    if kind == "object" or "additionalProperties" in schema:
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return f"dict[str, {py_type(extra, model, field)}]"
        return "dict[str, Any]"
    return "Any"


def models_source(doc: dict, requests: set[str]) -> str:
    out = ['"""Request and response models of the custody API, one per schema of its OpenAPI document.',
           "",
           "Written by scripts/gen_client.py from the served document: do not edit; run it again after an API",
           "change (tests/unit/test_client_contract.py fails until then). Request models refuse unknown fields,",
           "as the API does; response models ignore fields a newer service adds.",
           '"""',
           "from __future__ import annotations",
           "",
           "import uuid",
           "from datetime import datetime",
           "from typing import Any, Literal",
           "",
           "from pydantic import BaseModel, ConfigDict, Field",
           "",
           "from custody.client.types import Amount, Minor, Money",
           "",
           "",
           "def new_key() -> str:",
           '    """A fresh idempotency key: one per logical call, kept across its retries."""',
           "    return uuid.uuid4().hex",
           ""]
    schemas = doc["components"]["schemas"]
    for ref_name in sorted(schemas, key=lambda n: ("properties" in schemas[n], n)):  # enum aliases first
        schema, name = schemas[ref_name], class_name(ref_name)
        if name == "Money":
            continue
        if "properties" not in schema:
            out += ["", f"{name} = {py_type(schema)}", ""]
            continue
        out += ["", f"class {name}(BaseModel):"]
        doc_line = (schema.get("description") or "").strip().splitlines()
        if doc_line:
            out.append(f"    {repr(doc_line[0])}")
            out.append("")
        extra = "forbid" if ref_name in requests else "ignore"
        out.append(f'    model_config = ConfigDict(extra="{extra}")')
        out.append("")
        required = set(schema.get("required", []))
        for field, prop in schema["properties"].items():
            assert field.isidentifier() and not keyword.iskeyword(field) and not field.startswith("model_"), field
            kind = py_type(prop, name, field)
            if ref_name in requests and field in KEY_FIELDS:
                out.append(f"    {field}: {kind} = Field(default_factory=new_key)")
            elif field in required:
                out.append(f"    {field}: {kind}")
            elif "default" in prop:
                out.append(f"    {field}: {kind} = {prop['default']!r}")
            else:
                out.append(f"    {field}: {kind} | None = None" if "None" not in kind else f"    {field}: {kind} = None")
        out.append("")
    out += ["", "# Every model refers to others by name: resolve them all now, not at the first call.",
            "for _model in [v for v in list(globals().values()) if isinstance(v, type) and issubclass(v, BaseModel) and v is not BaseModel]:",
            "    _model.model_rebuild()"]
    return "\n".join(out).rstrip() + "\n"


def answer_of(op: dict) -> tuple[str | None, str]:
    """(python type of the success body or None for text, success status)."""
    for status, answer in sorted(op["responses"].items()):
        if int(status) < 400:
            schema = answer.get("content", {}).get("application/json", {}).get("schema")
            return (py_type(schema) if schema else None), status
    raise KeyError(op["operationId"])


def item_field(doc: dict, op: dict) -> str | None:
    """For a paged route answering an object: its one array property (the items)."""
    schema = op["responses"]["200"]["content"]["application/json"]["schema"]
    if "$ref" not in schema:
        return None
    props = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]["properties"]
    [name] = [k for k, v in props.items() if v.get("type") == "array"]
    return name


def methods_source(doc: dict) -> str:
    routes = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            routes.append((method.upper(), path, op, NAMES[(method.upper(), path)]))
    sync, asyn = [], []
    for method, path, op, name in routes:
        params = op.get("parameters", [])
        path_params = [p for p in params if p["in"] == "path"]
        query = [p for p in params if p["in"] == "query"]
        body_ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
        body_cls = class_name(body_ref) if body_ref else None
        answer, _ = answer_of(op)
        args = [f"{p['name']}: {py_type(p['schema'])}" for p in path_params]
        if body_cls:
            args.append(f"body: {body_cls} | Mapping[str, Any] | None = None")
        args_pos = ", ".join(["self", *args]) + (", /" if args else "")
        kw = []
        for p in query:
            kind = py_type(p["schema"])
            if p.get("required"):
                kw.append(f"{p['name']}: {kind}")
            elif "default" in p["schema"]:
                kw.append(f"{p['name']}: {kind} = {p['schema']['default']!r}")
            else:
                kw.append(f"{p['name']}: {kind} = None" if "None" in kind else f"{p['name']}: {kind} | None = None")
        if body_cls:
            kw.append("**fields: Any")
        if kw == ["**fields: Any"]:
            signature = args_pos + ", **fields: Any"
        else:
            signature = args_pos + (", *, " + ", ".join(kw) if kw else "")
        url = "f" + repr(re.sub(r"\{(\w+)\}", r"{_seg(\1)}", path)) if path_params else repr(path)
        qdict = "{" + ", ".join(f"{p['name']!r}: {p['name']}" for p in query) + "}" if query else "None"
        bodyx = f"_body({body_cls}, body, fields)" if body_cls else "None"
        ret = answer or "str"
        summary = (op.get("summary") or name).strip()
        docline = f"        {f'{method} {path}: {summary}'!r}"
        call = f"self._call({method!r}, {url}, params={qdict}, body={bodyx}, answer={_adapter(answer)})"
        sync += [f"    def {name}({signature}) -> {ret}:", docline, f"        return {call}", ""]
        asyn += [f"    async def {name}({signature}) -> {ret}:", docline, f"        return await {call}", ""]
        if any(p["name"] == "cursor" for p in query):
            items = item_field(doc, op)
            item_type = re.sub(r"^list\[(.*)\]$", r"\1", ret) if items is None else _items_type(doc, op, items)
            it = "iter_" + name.removeprefix("list_").removeprefix("get_")
            it_kw = ", ".join(k for k in kw if not k.startswith("cursor"))
            it_sig = args_pos + (", *, " + it_kw if it_kw else "")
            inner = f"lambda cursor: self._page({method!r}, {url}, params={qdict}, answer={_adapter(answer)})"
            itdoc = f"        {f'Every item of {method} {path}, page after page (follows X-Next-Cursor).'!r}"
            sync += [f"    def {it}({it_sig}) -> Iterator[{item_type}]:", itdoc,
                     f"        return self._walk({inner}, {items!r})", ""]
            asyn += [f"    def {it}({it_sig}) -> AsyncIterator[{item_type}]:", itdoc,
                     f"        return self._walk({inner}, {items!r})", ""]
    head = ['"""One method per route of the custody API: `SyncMethods` for `CustodyClient`, `AsyncMethods` for',
            "`AsyncCustodyClient`.",
            "",
            "Written by scripts/gen_client.py from the served OpenAPI document (method names: its NAMES table):",
            "do not edit. A method takes the path parameters positionally, then either a request model (or a",
            "mapping) as `body` or the body's fields as keywords, and the query parameters as keywords. A list",
            "method answers one page; its `iter_*` twin walks every page by the `X-Next-Cursor` header.",
            '"""',
            "from __future__ import annotations",
            "",
            "from collections.abc import AsyncIterator, Iterator, Mapping",
            "from typing import Any, Literal",
            "",
            "from pydantic import TypeAdapter",
            "",
            "from custody.client._base import _body, _seg",
            "from custody.client.models import *  # noqa: F403 (every model a signature names)",
            "from custody.client.models import AccountKind, OrderType, Side, StpPolicy, TimeInForce  # noqa: F401",
            "from custody.client.types import Money  # noqa: F401",
            "",
            "# The answer types, each parsed by one TypeAdapter built at import.",
            *[f"{const}: TypeAdapter[Any] = TypeAdapter({kind})" for kind, const in sorted(ADAPTERS.items())],
            "",
            "",
            "class SyncMethods:",
            '    """The routes, blocking (httpx.Client)."""',
            ""]
    mid = ["", "class AsyncMethods:", '    """The routes, awaitable (httpx.AsyncClient)."""', ""]
    return "\n".join(head + sync + mid + asyn).rstrip() + "\n"


ADAPTERS: dict[str, str] = {}  # python type -> the module constant holding its TypeAdapter


def _adapter(answer: str | None) -> str:
    if answer is None:
        return "None"
    if answer not in ADAPTERS:
        ADAPTERS[answer] = "_" + re.sub(r"\W+", "_", answer).strip("_").upper()
    return ADAPTERS[answer]


def _items_type(doc: dict, op: dict, items: str) -> str:
    schema = op["responses"]["200"]["content"]["application/json"]["schema"]
    props = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]["properties"]
    return py_type(props[items]["items"])


def request_schemas(doc: dict) -> set[str]:
    """Schemas reachable from a request body."""
    schemas, found, todo = doc["components"]["schemas"], set(), []
    for item in doc["paths"].values():
        for op in item.values():
            ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
            if ref:
                todo.append(ref.rsplit("/", 1)[-1])
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        todo += [r.rsplit("/", 1)[-1] for r in re.findall(r"'\$ref': '([^']+)'", repr(schemas[name]))]
    return found


def main() -> None:
    doc = load_document()
    target = ROOT / "custody" / "client"
    (target / "models.py").write_text(models_source(doc, request_schemas(doc)))
    (target / "_methods.py").write_text(methods_source(doc))
    subprocess.run([sys.executable, "-m", "ruff", "format", "-q", str(target / "models.py"), str(target / "_methods.py")],
                   check=False, stderr=subprocess.DEVNULL)  # ruff when installed
    print("wrote custody/client/models.py and custody/client/_methods.py")


if __name__ == "__main__":
    main()
