"""Signed webhooks, a second sink for outbox events (issue 14).

- `signing`: the body, headers and signature scheme, and `verify_signature` / `verify_event`
  for receivers.
- `keys`: endpoint secrets (generated, shown once, stored encrypted under the webhook key).
- `endpoints`: `Webhooks`, the admin API's service (register, update, delete, rotate, replay)
  and the worker's job entry (`run_once`).
- `delivery`: the job itself (fan-out, POST, retry with backoff, dead letter).

The README's "Webhooks" section is the receiver's guide.
"""
from custody.webhooks.signing import WebhookSignatureError, verify_event, verify_signature

__all__ = ["WebhookSignatureError", "verify_event", "verify_signature"]
