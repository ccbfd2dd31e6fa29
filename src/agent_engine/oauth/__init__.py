"""Owners' own accounts at OWNER_OAUTH tool sources: the MCP authorization flow (discovery,
registration, authorization code with PKCE, refresh, revocation) and the tokens kept encrypted.

`access.owner_access_token` is what a tool call asks for; `flow` starts and completes a
connection; `keys` encrypts what is stored.
"""
