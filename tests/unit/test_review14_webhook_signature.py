"""Review 14 (R2): the webhook receiver's check returns an event id that the signature does not cover.

custody.webhooks.signing signs `<timestamp>.<body>` only; `verify_signature` then returns the
`Custody-Event-Id` HEADER, and the module tells receivers to de-duplicate on it. Whoever captured
one delivery (a proxy log, a TLS-terminating load balancer, an http:// endpoint) can therefore
re-send it within the 300 s tolerance with another `Custody-Event-Id`: the body and signature are
unchanged, the check passes, and it returns the forged id, so the receiver's de-duplication sees a
new event and applies the same `deposit.credited` (or fill) a second time.

Expected: a header id that is not the signed body's `id` is refused (or the id returned is the
signed one). Marked xfail(strict) until custody.webhooks.signing is fixed.
"""
from __future__ import annotations

import time

import pytest

from custody.webhooks.signing import WebhookSignatureError, delivery_headers, event_body, verify_signature

SECRET = "whsec_" + "5a" * 32


def test_a_captured_delivery_resent_with_another_event_id_is_not_a_new_event():
    event_id = "deposit.credited:41"
    body = event_body(event_id, "deposit.credited", "2026-12-01T16:00:00+00:00",
                      {"observation_id": 41, "account_id": 7, "amount": 100_000_000})
    now = int(time.time())
    headers = delivery_headers([SECRET], event_id, "deposit.credited", now, body)
    assert verify_signature(SECRET, headers, body) == event_id  # the genuine delivery

    replayed = {**headers, "Custody-Event-Id": event_id + ":again"}  # body, timestamp, signature unchanged
    try:
        returned = verify_signature(SECRET, replayed, body, now=now + 30)
    except WebhookSignatureError:
        return  # refused: fixed
    assert returned == event_id, f"the receiver would de-duplicate on the forged id {returned!r}"


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/",  # cloud instance metadata
    "http://127.0.0.1:18443/",                   # a local bitcoind's RPC port
    "http://[::1]:8545/",                        # a local anvil / geth JSON-RPC (no auth)
    "http://10.0.0.5:5432/",                     # the database's private address
])
def test_a_webhook_url_may_not_name_an_internal_address(url):
    from custody.errors import CustodyError
    from custody.webhooks.endpoints import check_url

    with pytest.raises(CustodyError) as refused:
        check_url(url)
    assert refused.value.code.value == "webhook_url_invalid"
