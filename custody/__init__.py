"""The service: operational tables, deposit/withdrawal pipelines, HTTP API, scheduler jobs.
Wires every other package together; nothing imports custody.
"""
