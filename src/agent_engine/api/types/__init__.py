"""Strawberry object types of the contract, one module per aggregate, each built from a row by a
`from_row` (or a value by `from_value`) constructor.

Related objects are resolved through the request's DataLoaders, never by a query per object.
"""
