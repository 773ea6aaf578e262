"""custody.client against the served OpenAPI document (issue 19, must show 3).

Every route (method + path) has one method on both clients, with the route's path parameters
positionally, its query parameters as keywords, its request body model and its answer type; every
schema of the document has a client model with the same fields, the same required-ness and the same
kind of type (int, str, bool, array, object, enum, nested model; decimal strings are `Decimal`,
minor-unit strings `int`). The one documented difference: idempotency keys are required on the wire
and filled by the client (a uuid4) when the caller gives none. A route or field added to the API
without running `python scripts/gen_client.py` fails here.
"""
from __future__ import annotations

import inspect
import re
import sys
import types
import typing
from datetime import datetime
from decimal import Decimal

import pytest
from pydantic import BaseModel

from custody.api.app import create_app
from custody.client import AsyncCustodyClient, CustodyClient, models
from custody.client._base import KEY_FIELDS
from custody.client.types import Money
from custody.container import Container

RENAMES = {"custody__api__webhook_routes__RotateIn": "WebhookRotateIn",
           "custody__api__api_key_routes__RotateIn": "ApiKeyRotateIn"}


@pytest.fixture(scope="module")
def doc() -> dict:
    return create_app(Container.__new__(Container)).openapi()


def client_routes(cls: type) -> dict[tuple[str, str], str]:
    found = {}
    for name, fn in inspect.getmembers(cls, callable):
        m = re.match(r"^(GET|POST|PUT|PATCH|DELETE) (\S+): ", fn.__doc__ or "")
        if m and not name.startswith("_"):
            assert (m[1], m[2]) not in found, (name, found.get((m[1], m[2])))
            found[(m[1], m[2])] = name
    return found


def model_named(ref: str) -> type[BaseModel] | object:
    name = ref.rsplit("/", 1)[-1]
    name = RENAMES.get(name, name)
    return Money if name == "Money" else getattr(models, name)


def doc_kinds(schema: dict, doc: dict) -> set:
    """The kinds of value a schema allows, in the vocabulary `py_kinds` also answers."""
    if "$ref" in schema:
        target = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
        if "properties" not in target:  # an enum schema
            return doc_kinds(target, doc)
        return {("model", RENAMES.get(schema["$ref"].rsplit("/", 1)[-1], schema["$ref"].rsplit("/", 1)[-1]))}
    if "anyOf" in schema:
        return set().union(*(doc_kinds(s, doc) for s in schema["anyOf"]))
    kind = schema.get("type")
    if kind == "string" and "enum" in schema:
        return {("enum", tuple(sorted(schema["enum"])))}
    if kind == "array":
        return {("array", frozenset(doc_kinds(schema.get("items", {}), doc)))}
    if kind == "object" or "additionalProperties" in schema:
        extra = schema.get("additionalProperties")
        return {("object", frozenset(doc_kinds(extra, doc)) if isinstance(extra, dict) and extra else "any")}
    return {kind or "any"}


def py_kinds(annotation: object) -> set:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:  # Minor: an int sent and received as a string
        if any(getattr(m, "return_type", None) is str for m in annotation.__metadata__):
            return {"string"}
        return py_kinds(args[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(py_kinds(a) for a in args))
    if origin is typing.Literal:
        return {("enum", tuple(sorted(args)))}
    if origin is list:
        return {("array", frozenset(py_kinds(args[0])))}
    if origin is dict:
        return {("object", "any" if args[1] is typing.Any else frozenset(py_kinds(args[1])))}
    if annotation is type(None):
        return {"null"}
    if annotation is typing.Any:
        return {"any"}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {("model", annotation.__name__)}
    # Decimal (Amount), datetime and int minor units (Minor) are strings on the wire
    return {{int: "integer", bool: "boolean", str: "string", Decimal: "string", datetime: "string"}[annotation]}


def test_every_route_has_one_method_on_both_clients(doc):
    served = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    assert set(client_routes(CustodyClient)) == served
    assert client_routes(AsyncCustodyClient) == client_routes(CustodyClient)
    for name in client_routes(AsyncCustodyClient).values():
        assert inspect.iscoroutinefunction(getattr(AsyncCustodyClient, name)), name


def test_each_method_takes_the_routes_parameters_body_and_answers_its_type(doc):
    methods = client_routes(CustodyClient)
    hints_ns = {**vars(models), "Money": Money}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            fn = getattr(CustodyClient, methods[(method.upper(), path)])
            sig = inspect.signature(fn)
            hints = typing.get_type_hints(fn, globalns={**vars(sys.modules[fn.__module__]), **hints_ns})
            params = op.get("parameters", [])
            positional = [p.name for p in sig.parameters.values() if p.kind is p.POSITIONAL_ONLY][1:]
            keywords = {p.name: p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY}
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            assert positional == [p["name"] for p in params if p["in"] == "path"] + (["body"] if body else []), path
            query = {p["name"]: p for p in params if p["in"] == "query"}
            assert set(keywords) == set(query), (method, path)
            for name, p in query.items():
                assert (keywords[name].default is inspect.Parameter.empty) == bool(p.get("required")), (path, name)
                assert py_kinds(hints[name]) - {"null"} == doc_kinds(p["schema"], doc) - {"null"}, (path, name)
            if body:
                assert model_named(body["$ref"]) in typing.get_args(hints["body"]), (method, path)
            [(status, answer)] = [(s, a) for s, a in op["responses"].items() if int(s) < 400]
            schema = answer.get("content", {}).get("application/json", {}).get("schema")
            if schema is None:
                assert hints["return"] is str, path
            else:
                assert py_kinds(hints["return"]) == doc_kinds(schema, doc), (method, path)


def test_every_schema_has_a_model_with_the_same_fields_required_ness_and_types(doc):
    schemas = doc["components"]["schemas"]
    request_models = set()
    for item in doc["paths"].values():
        for op in item.values():
            ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
            if ref:
                request_models.add(model_named(ref))
    checked = 0
    for ref_name, schema in schemas.items():
        if "properties" not in schema:
            continue
        model = model_named(ref_name)
        fields = model.model_fields
        assert set(fields) == set(schema["properties"]), ref_name
        for name, prop in schema["properties"].items():
            required = name in schema.get("required", [])
            if required and name in KEY_FIELDS and model in request_models:
                assert fields[name].default_factory is not None, (ref_name, name)  # filled by the client
            else:
                assert fields[name].is_required() == required, (ref_name, name)
            assert py_kinds(annotation_of(fields[name])) - {"null"} == doc_kinds(prop, doc) - {"null"}, (ref_name, name)
            if "null" in doc_kinds(prop, doc) or not required:
                assert not fields[name].is_required() or "null" in py_kinds(annotation_of(fields[name])), (ref_name, name)
            wire_string = "string" in doc_kinds(prop, doc)
            if wire_string and ("decimal string" in (prop.get("description") or "")
                                or name in ("amount", "value", "fee", "qty", "price")):
                if (ref_name, name) not in {("ReserveAddressOut", "amount"), ("ProofLeafOut", "amount")}:  # minor units there
                    assert Decimal in _leaves(annotation_of(fields[name])), (ref_name, name)
            if (prop.get("description") or "").startswith("minor units") or name.endswith("_minor") or name == "minor":
                if wire_string:
                    assert int in _leaves(annotation_of(fields[name])), (ref_name, name)
            checked += 1
    assert checked > 300


def annotation_of(field) -> object:  # noqa: ANN001
    """The field's annotation with the metadata pydantic moved out of a top-level Annotated."""
    return typing.Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation


def _leaves(annotation: object) -> set:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return {args[0]}
    if not args:
        return {annotation}
    return set().union(*(_leaves(a) for a in args))


def test_the_client_imports_nothing_of_the_service():
    import subprocess

    code = ("import sys, custody.client; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('sqlalchemy', 'ledger', 'matching', 'fastapi', 'psycopg', 'chain_adapters', 'signer') "
            "or m.startswith('custody.') and not m.startswith('custody.client')); print(bad); assert not bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_float_amount_is_refused_before_anything_is_sent():
    with pytest.raises(ValueError, match="never float"):
        models.HoldIn(account_id=1, amount=0.1, reference="r")
    hold = models.HoldIn(account_id=1, amount=Decimal("0.10000001"), reference="r")
    assert hold.model_dump(mode="json")["amount"] == "0.10000001"
    assert Money.model_validate({"value": "1.5", "minor": "150000000"}) == Money(value=Decimal("1.5"), minor=150_000_000)
