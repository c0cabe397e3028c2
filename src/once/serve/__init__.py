"""`once serve`: a read-only dashboard, `/metrics`, `/api/status` and `/healthz` over the ledger.

    server   the HTTP server: its connections, refusing when busy, its start and stop
    handler  one request: its Host, deadline and slot, the token, its route and answer
    hosts    the names it answers under (its guard against DNS rebinding)
    options  what it serves and how: ServeOptions, --listen
    reads    the ledger reads, shared by the requests that want the same and bounded
    data     what the pages show, read in bounded time without writing (once.report's
             functions, once.ledger's engines and history)
    pages    the HTML's frame, a job's page and an attempt's output (no script from
             elsewhere; a strict Content-Security-Policy)
    overview `/`: the filter by state and name, the order and the pages of the fleet
    status   `/api/status`: every job in full, or a page of those that match a query

A report-path part: `once run` never imports it. The CLI (once.cli.reports) uses the four names
re-exported here.
"""

from once.serve.hosts import Hosts
from once.serve.options import ServeOptions, parse_listen
from once.serve.server import serve

__all__ = ["Hosts", "ServeOptions", "parse_listen", "serve"]
