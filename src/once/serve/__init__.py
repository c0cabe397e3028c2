"""`once serve`: a read-only dashboard, `/metrics`, `/api/status` and `/healthz` over the ledger.

    server   the HTTP server: routes, the token, bounded reads, refusing when busy
    data     what the pages show, read in bounded time without writing (once.report's
             functions, once.ledger's engines and history)
    pages    the HTML's frame, a job's page and an attempt's output (no script from
             elsewhere; a strict Content-Security-Policy)
    overview `/`: the filter by state and name, the order and the pages of the fleet
    status   `/api/status`: every job in full, or a page of those that match a query

A report-path part: `once run` never imports it. The CLI (once.cli.commands) uses the three names
re-exported here.
"""

from once.serve.server import ServeOptions, parse_listen, serve

__all__ = ["ServeOptions", "parse_listen", "serve"]
