"""Convert: quoted cross-asset exchange through the house's liquidity accounts (issue 17).

`pricing` is the pure arithmetic of a quote (rates, fee, rounding); `service` stores quotes and
books their acceptance through the database functions of migration 0033. The HTTP routes are
`custody.api.convert_routes`; the README's "Convert" section has the worked example.
"""
