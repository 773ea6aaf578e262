"""The internal HTTP API (FastAPI, versioned under /v1): one router module per resource."""
