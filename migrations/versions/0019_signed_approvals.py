"""An approval row carries the approver's signature over exactly what is paid.

Revision ID: 0019_signed_approvals
Revises: 0018_reconciliation_lines

Why: the signer counted operator approvals from `approval` rows, which any process that can write
the database can forge (issue 12). An approval is now a signature by the approver's own key
(signer.approvals): custody verifies it when the operator approves and stores it here, with the
exact payload bytes that were signed; the signer verifies every stored signature again against the
approver keys it is itself configured with, rebuilding the payload from the withdrawal and its
decision, and refuses any approval row without one.

What changes: `approval` gains `key_id`, `scheme`, `signed_payload`, `signature`,
`authenticator_data` and `client_data_json` (the last two for WebAuthn assertions). They are
nullable: rows written before this migration, and rejections (which need no signature: they only
release money), have none; the signer refuses an unsigned approval (`approval_unsigned`). An
approval that has a signature has all of key id, scheme, payload and signature (a CHECK).
"""
from alembic import op

revision = "0019_signed_approvals"
down_revision = "0018_reconciliation_lines"
branch_labels = None
depends_on = None

SQL = """
ALTER TABLE approval
    ADD COLUMN key_id              text,
    ADD COLUMN scheme              text CHECK (scheme IN ('ed25519', 'webauthn')),
    ADD COLUMN signed_payload      bytea,
    ADD COLUMN signature           bytea,
    ADD COLUMN authenticator_data  bytea,
    ADD COLUMN client_data_json    bytea,
    ADD CONSTRAINT approval_signature_complete CHECK (
        (signature IS NULL AND key_id IS NULL AND scheme IS NULL AND signed_payload IS NULL)
        OR (signature IS NOT NULL AND key_id IS NOT NULL AND scheme IS NOT NULL AND signed_payload IS NOT NULL));
"""


def upgrade() -> None:
    op.execute(SQL)


def downgrade() -> None:
    op.execute("ALTER TABLE approval DROP CONSTRAINT approval_signature_complete, DROP COLUMN key_id, DROP COLUMN scheme, "
               "DROP COLUMN signed_payload, DROP COLUMN signature, DROP COLUMN authenticator_data, DROP COLUMN client_data_json")
