"""`once serve`: a read-only dashboard, `/metrics`, `/api/status` and `/healthz` over the ledger.

    server   the HTTP server: routes, the token, bounded reads, refusing when busy
    data     what the pages show, read in bounded time without writing (once.report's
             functions, once.ledger's engines and queries)
    pages    the HTML (no script from elsewhere; a strict Content-Security-Policy)

A report-path part: `once run` never imports it. The CLI (once.commands) uses the three names
re-exported here.
"""

from once.serve.server import Settings, parse_listen, serve

__all__ = ["Settings", "parse_listen", "serve"]
